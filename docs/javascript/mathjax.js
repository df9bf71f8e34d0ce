// MathJax settings for pymdownx.arithmatex (generic mode): \( \) inline, \[ \] display.
// Loaded before the vendored mathjax/tex-svg-full.js, which reads window.MathJax when it starts.
window.MathJax = {
  tex: { inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true },
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex" },
  svg: { fontCache: "global" },  // one <defs> of glyphs for the page, not one per formula
};
