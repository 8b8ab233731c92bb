"""The edge: the plumbing the raw ASGI apps in front of Django share (gpucap/asgi.py: the
instance metadata endpoint, the inference router, the model simulator). Reading a request's
body and sending a whole answer (``http``); a client per event loop, closed at the lifespan's
shutdown (``loops``).

No app owns it and it imports none: each app keeps its own wire format and error answers.
"""
