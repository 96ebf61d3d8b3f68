"""The live notebook view (ipywidgets + plotly) and its pure model and renderers."""
