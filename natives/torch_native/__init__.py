"""torch-native: PyTorch's own built-ins as a conformance backend (natives/__init__.py for the mapping
rule): torch.optim classes, torch.optim.lr_scheduler classes, torch.nn.functional losses,
clip_grad_norm_ / clip_grad_value_, torch.amp.GradScaler and plain accumulation into `.grad`."""
