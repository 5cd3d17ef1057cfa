"""The assigner's web views (``/ui``): server-rendered HTML with inline SVG, no scripts.

* :mod:`.history` keeps a small ring of lag samples per partition (pure);
* :mod:`.model` is the data each page shows; :mod:`.gather` builds it from the live
  groups on the event loop (the only module here that does I/O);
* :mod:`.render` and :mod:`.charts` turn that data into HTML and SVG (pure);
* :mod:`.routes` serves the pages on the HTTP endpoint's threads.
"""
