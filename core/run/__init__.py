"""One training run. Here: the spec, model assembly, the loop and what it is built from; around
it, one room each for the output folder (``output``), resuming (``resume``), fault handling
(``reliability``), what the run reports (``reporting``) and the Hub (``publishing``)."""
