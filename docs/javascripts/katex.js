// Renders the math that pymdownx.arithmatex (generic mode) wraps in `.arithmatex` elements, on
// every page load, including Material's instant navigation (document$).
document$.subscribe(() => {
  for (const element of document.querySelectorAll(".arithmatex")) {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
});
