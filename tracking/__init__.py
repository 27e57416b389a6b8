"""Tracking app: open pixel, click redirect, legacy codes, SendGrid webhook."""
