"""`kformer serve`: an HTTP translation server on the runners of an export folder (no TensorFlow).

server.py starts it (uvicorn); app.py has its routes (Starlette); batcher.py gathers concurrent
requests into runner calls; kformer_api.py and libretranslate.py read and answer the two APIs;
requests.py reads bodies; metrics.py counts; settings.py holds the limits and their defaults.
"""
