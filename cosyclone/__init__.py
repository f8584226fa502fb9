"""cosyclone: offline, batched voice cloning with CosyVoice3."""

__version__ = "0.1.0"
