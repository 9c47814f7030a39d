"""The browser page (Chromium, Firefox) and the wheel that ships it."""
