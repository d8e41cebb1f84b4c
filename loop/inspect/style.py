"""The report page's stylesheet, inlined into every report (no network, no files)."""

from __future__ import annotations

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2329;
background:#f6f7f9}
header{background:#1f2a37;color:#fff;padding:10px 20px}header h1{font-size:18px;margin:0}
main{padding:0 20px 40px}h2{font-size:16px;margin:22px 0 8px}h3{font-size:15px;margin:0}
h4{font-size:13px;margin:10px 0 4px}code,pre{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}
table{border-collapse:collapse;background:#fff;margin:4px 0}
th,td{border:1px solid #dde1e6;padding:2px 7px;text-align:right;white-space:nowrap}
th:first-child{text-align:left}tr th[title]{cursor:help}
table.groups{font-size:12px}details{margin:8px 0}summary{cursor:pointer;font-weight:600}
.sources{margin:10px 0;padding-left:18px}
.curve{max-width:760px;width:100%;border:1px solid #dde3ea}
.note{color:#5b6570;font-size:12px;margin:4px 0}
.charts{display:flex;flex-wrap:wrap;gap:6px}
.chart{margin:0;background:#fff;border:1px solid #dde1e6}
.chart text{font-size:11px}.chart-title{font-weight:600}
.swatch{display:inline-block;width:11px;height:11px;margin:0 4px 0 10px;vertical-align:-1px;
border:1px solid #0003}
#filters{position:sticky;top:0;z-index:5;background:#f6f7f9;padding:6px 0;display:flex;gap:8px;
flex-wrap:wrap;align-items:center;border-bottom:1px solid #dde1e6}
#filters label{font-size:12px;color:#5b6570}#filters select,#filters input{font-size:13px}
.chip{background:#dbe7fb;border-radius:10px;padding:1px 8px;font-size:12px}
.chip button{border:0;background:none;cursor:pointer}
.card{background:#fff;border:1px solid #dde1e6;border-radius:6px;margin:12px 0;padding:10px 14px}
.card .meta{font-weight:400;color:#5b6570;font-size:12px;margin-left:8px}
.instruction{margin:4px 0 8px;font-style:italic}
.maps{display:flex;flex-wrap:wrap;gap:18px}.map{margin:0}.map figcaption{font-size:12px;
font-weight:600}.heatmap{cursor:pointer;display:block}.hover{font-size:12px;color:#333;min-height:17px}
.legend{font-size:11px;margin:4px 0}.legend span{white-space:nowrap;margin-right:6px}
.rollouts{font-size:12px;margin-top:8px}.rollouts tr{cursor:pointer}
.rollouts tr:hover td{background:#eef4ff}.rollouts tr.sel td{background:#dbe7fb}
.ok{color:#1a7f37;font-weight:600}.bad{color:#c62828;font-weight:600}
.transcript{margin-top:10px}.thead{background:#eef1f5;padding:6px 10px;border-radius:4px}
.thead button{float:right}.turn{border-left:3px solid #c9d1da;padding:2px 0 6px 10px;margin:10px 0}
.turn.failed{border-left-color:#e0605b}.thought{white-space:pre-wrap;margin:4px 0}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;padding:6px 8px;border-radius:4px;
max-height:420px;overflow:auto}
pre.code{background:#f3f6fa;border:1px solid #d7dee6}
pre.obs{background:#fbfbf6;border:1px dashed #ccc}
pre.obs.err,.error{background:#fdecea;border-color:#e0605b}
table.calls{font-size:12px}table.calls td,table.calls th{text-align:left;white-space:normal}
table.calls tr.fail td{background:#fdecea;color:#9b1c1c}.args{font-family:ui-monospace,monospace;
max-width:700px;overflow-wrap:anywhere}
.tests li.pass::marker{content:"\\2713  ";color:#1a7f37}.tests li.fail::marker{content:"\\2717  ";
color:#c62828}.tests .msg{color:#9b1c1c;font-size:12px;white-space:pre-wrap}
.tokview{font:12px/1.9 ui-monospace,monospace;white-space:pre-wrap;background:#fff;
border:1px solid #dde1e6;padding:6px;max-height:420px;overflow:auto}
.tok{border-bottom:2px solid #1f6feb;border-radius:2px}
.tok.untrained{border-bottom-color:transparent;
opacity:.55}.tokens button{font-size:12px;margin:2px 0}
"""
