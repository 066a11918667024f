"""The `Updater` class of a torch snippet: one optimizer update per call, as the spec says."""

from __future__ import annotations

from conformance.config import Config
from conformance.port.write.common import block, lit


def _loss_lines(config: Config) -> list[str]:
    if config.accumulation.normalize == "tokens":
        # the window's element count is known before the first forward pass (the 2024 fix)
        return ["total = sum(float(count_fn(y)) for _, y in window)  # valid elements of the window",
                "for x, y in window:",
                "    with torch.autocast(self.device_type, dtype=COMPUTE_DTYPE, enabled=AUTOCAST):",
                "        output = self.model(x)",
                "    part = loss_fn(output.to(PARAM_DTYPE), y) / total  # loss_fn sums over the elements",
                "    (self.scaler.scale(part) if self.scaler else part).backward()",
                "    loss += part.detach()"]
    return ["for x, y in window:",
            "    with torch.autocast(self.device_type, dtype=COMPUTE_DTYPE, enabled=AUTOCAST):",
            "        output = self.model(x)",
            "    part = loss_fn(output.to(PARAM_DTYPE), y) / len(window)  # an incomplete window: its own size",
            "    (self.scaler.scale(part) if self.scaler else part).backward()",
            "    loss += part.detach()"]


def _policy_lines(config: Config) -> list[str]:
    p = config.precision
    if p.on_nonfinite == "raise":
        return ['    raise FloatingPointError("non-finite loss or gradient (on_nonfinite = \'raise\'); not applied")']
    if p.max_consecutive_skips is None:
        return []
    return [f"    if self.skipped_in_a_row > {p.max_consecutive_skips}:",
            f'        raise FloatingPointError(f"{{self.skipped_in_a_row}} consecutive updates skipped for '
            f'non-finite values (max_consecutive_skips = {p.max_consecutive_skips})")']


def _ema_init(config: Config) -> str:
    e = config.ema
    if not e.enabled:
        return ""
    pad = " " * 16  # the __init__ body's indentation in the template below
    lines = ["# [ema]: torch's EMA of the weights (float32 weights: the spec's float32 EMA; it keeps",
             "# bfloat16/float16 weights' own dtype), updated after applied updates t >= start,",
             "# (t - start) % every == 0: the first copies the weights",
             "self.ema = torch.optim.swa_utils.AveragedModel(",
             f"    model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn({lit(e.decay)}))",
             "self.updates = 0"]
    return "".join("\n" + pad + line for line in lines)


def _ema_update(config: Config) -> list[str]:
    e = config.ema
    if not e.enabled:
        return []
    return [f"    if self.updates >= {e.start} and (self.updates - {e.start}) % {e.every} == 0:",
            "        self.ema.update_parameters(self.model)"]


def updater_code(config: Config, clip: list[str], step_clip: list[str] | None = None) -> str:
    """The Updater class (clip: the clipping statements, run on unscaled, finite gradients;
    step_clip: clip.target = "updates", the statements that clip the step, with `before` the
    parameters before it)."""
    p, a = config.precision, config.accumulation
    scaler = "None"
    if p.dynamic_scaling:
        scaler = (f"torch.amp.GradScaler(self.device_type, init_scale={lit(p.init_scale)}, growth_factor="
                  f"{lit(p.growth_factor)},\n{' ' * 38}backoff_factor={lit(p.backoff_factor)}, "
                  f"growth_interval={p.growth_interval})")
    sched = "PerEpoch(build_scheduler(self.optimizer))" if config.schedule.unit == "epoch" else \
        "build_scheduler(self.optimizer)"
    tokens = a.normalize == "tokens"
    call = "window, loss_fn, count_fn" if tokens else "window, loss_fn"
    what = ("loss_fn(output, y) -> the loss summed over y's valid elements; count_fn(y) -> their number"
            if tokens else "loss_fn(output, y) -> the micro-batch's mean loss")
    advance = "finite" if p.schedule_on_skip == "hold" else "True"
    head = block(f'''
        PARAM_DTYPE = torch.{p.param_dtype}  # master weights and optimizer state (build the model in it)
        COMPUTE_DTYPE = torch.{p.compute_dtype}
        AUTOCAST = {p.autocast}
        NORM_TYPE = {lit(config.clip.norm_type)}
        torch.backends.cuda.matmul.allow_tf32 = {p.allow_tf32}


        class Updater:
            """One optimizer update per call: accumulate over the window's micro-batches ({a.steps} per
            update, normalize = "{a.normalize}"), unscale, skip a non-finite update, clip, step."""

            def __init__(self, model):
                self.model = model
                self.params = [q for q in model.parameters() if q.requires_grad]
                self.device_type = self.params[0].device.type
                self.optimizer = build_optimizer(model.named_parameters())
                self.scheduler = {sched}{_hyper_init(config)}
                self.scaler = {scaler}
                self.skipped_in_a_row = 0{_ema_init(config)}

            def __call__(self, {call}):
                """window: a list of (x, y) micro-batches; {what}.
                Returns {{"loss", "grad_norm" (before clipping), "skipped", "lr" (per group)}}."""
                lr = [group["lr"] for group in self.optimizer.param_groups]
                self.optimizer.zero_grad(set_to_none=True)
                loss = 0.0
        ''')
    body = _loss_lines(config) + [
        "grads = [q.grad for q in self.params if q.grad is not None]",
    ]
    if p.dynamic_scaling:
        body += [
            "inv = torch.tensor(1.0 / self.scaler.get_scale()).float()  # GradScaler's float32 1 / scale",
            "checks = [torch.isfinite(loss)] + [torch.isfinite(g.abs().amax() * inv) for g in grads]",
            "finite = bool(torch.stack(checks).all())  # the loss and every unscaled gradient: one sync",
            "if not finite:  # GradScaler checks the scaled gradients only; the spec also the loss and the unscaled",
            '    grads[0].view(-1)[0] = float("nan")  # let the scaler see the skip and back off',
            "self.scaler.unscale_(self.optimizer)  # unscale before clipping",
        ]
    else:
        body += ["checks = [torch.isfinite(loss)] + [torch.isfinite(g).all() for g in grads]",
                 "finite = bool(torch.stack(checks).all())  # the loss and every gradient: one sync"]
    body += ["norm = torch.nn.utils.get_total_norm(grads, NORM_TYPE)",
             "if finite:", *("    " + line for line in clip),
             *(["    before = [q.detach().clone() for q in self.params]"] if step_clip else []),
             "    self.optimizer.step()" if not p.dynamic_scaling else "    self.scaler.step(self.optimizer)",
             *("    " + line for line in step_clip or []),
             "    self.skipped_in_a_row = 0", *_ema_update(config),
             "else:  # skipped: parameters and optimizer state stay as they are",
             "    self.skipped_in_a_row += 1", *_policy_lines(config)]
    if p.dynamic_scaling:
        body.append("self.scaler.update()")
    if config.ema.enabled:
        body.append("self.updates += 1  # counted as the spec counts updates: skipped ones too")
    stepped = (["self.scheduler.step()"] if config.schedule.name != "reduce_on_plateau" else []) + (
        ["self.hyper.step()"] if config.schedule.hyper else [])  # a plateau steps on metrics (observe)
    if stepped:
        body += [f"if {advance}:  # schedule_on_skip = \"{p.schedule_on_skip}\"", *("    " + x for x in stepped)]
    body.append('return {"loss": float(loss), "grad_norm": float(norm), "skipped": not finite, "lr": lr}')
    out = head + "\n" + block("\n".join(body), 8)
    if config.schedule.name == "reduce_on_plateau":
        out += "\n\n" + block(f'''
            def observe(self, metric):
                """reduce_on_plateau: the {config.schedule.monitor} of an evaluation (after an update)."""
                self.scheduler.step(metric)
            ''', 4)
    return out


def _hyper_init(config: Config) -> str:
    if not config.schedule.hyper:
        return ""
    return "\n                self.hyper = ScheduledHyperparameters(self.optimizer)  # [schedule.hyper]"
