"""The offline attention viewer: compute, encode, render, and show in a notebook.

- `build`: traces text and runs the analyses a page shows (`build_viewer`);
- `encoding`: how heads, intervals and mixing maps are stored in a page;
- `options`: `ViewerOptions` and `ViewerPage`, what a page holds;
- `page`: renders a page (`viewer_html`, `viewer_iframe`, `viewer_fragment`) and reads one back;
- `widget`: the same page as a notebook widget (anywidget).

It sits above the experiments: it may call every analysis and `identifiable.report`'s HTML
helpers, and nothing below imports it.
"""
