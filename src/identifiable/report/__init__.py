"""Rendering: the reproduction report, the comparison and sweep pages, as self-contained HTML.

This floor only renders tables it is given; it imports nothing above it. `report.tables` is
the stage → report contract: the tables each stage hands over, which the stages below
import. The viewer's pages live in `identifiable.viewer`; `identifiable.runs.reproduce`
runs the whole paper into one folder.
"""
