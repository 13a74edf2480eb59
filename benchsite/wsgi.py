"""WSGI entry point.

After the application is loaded, everything alive (Django, the apps, numpy: about 150 000
objects tracked by the cyclic garbage collector) is moved to the collector's permanent
generation (`gc.freeze`, Python docs "gc"). A history page builds tens of thousands of point
dicts per request; the collections that triggers otherwise traverse the whole startup heap each
time (measured at 100 000 runs: the compare page's JSON 214 ms -> 135 ms of CPU). Objects
created later are collected as usual, with a young-generation threshold of YOUNG_THRESHOLD
allocations instead of Python's 700: a page over a 3 240-run sweep allocates a few hundred
thousand containers that nearly all live to the end of the request, and at 700 the collector
traversed them again and again (measured on the 2-core machine, 100k runs, CPU ms p50 / max of
10 requests, 700 -> 10 000: compare 92/93 -> 77/98, its JSON 78/82 -> 67/70, sweep 51/297 ->
50/51; peak RSS 223 -> 225 MB). Cycles are still found, a little later.
"""

import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")
application = get_wsgi_application()


#: Allocations (minus deallocations) of tracked objects between two young-generation collections.
YOUNG_THRESHOLD = 10_000


def freeze_startup_heap() -> int:
    """Collect, then freeze every object now tracked by the garbage collector, and set the
    young generation's threshold to YOUNG_THRESHOLD (the older two keep Python's 10 and 10);
    returns how many objects are frozen (gc.get_freeze_count())."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    return gc.get_freeze_count()


freeze_startup_heap()
