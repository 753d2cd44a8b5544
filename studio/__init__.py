"""The Gradio app's own modules (its session state and app-level measurements); `app.py` is the layout and
wiring. The library (`core/`) never imports this package or `app`."""
