"""kvspec impl."""
