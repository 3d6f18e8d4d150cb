"""The embedded engine: a small hybrid GDN model, a scheduler with prefix caching at every block
boundary, and the ``gdn-graphs`` command line. It uses the runtime like any other engine would."""
