"""Results: the `Result` base every result dataclass shares, its file format, its HTML and
its plots, and the one colormap of plots and viewer. The lowest floor: it imports only
`identifiable.errors` and `identifiable.store`.

- `base`: `Result` (to_pandas, to_xarray, plot, save/load, _repr_html_) and `load`;
- `files`: the `.safetensors` + JSON result format, read without unpickling;
- `html`: `_repr_html_`'s headline, inline picture and table;
- `plots`: the figures of `Result.plot`;
- `colormap`: the diverging colormap and the panel-scale rule.
"""

from identifiable.results.base import Result, load

__all__ = ["Result", "load"]
