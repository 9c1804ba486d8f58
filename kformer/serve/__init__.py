"""`kformer serve`: an HTTP translation server on the runners of an export folder (no TensorFlow).

server.py starts it (uvicorn; connections.py: deadlines for a request to arrive); app.py has its
routes (Starlette); batcher.py gathers concurrent requests into runner calls; kformer_api.py and
libretranslate.py read and answer the two APIs; html.py reads and writes web pages; requests.py
reads bodies; cost.py says what a request is charged against the limits; metrics.py counts;
settings.py holds the limits and their defaults.
"""
