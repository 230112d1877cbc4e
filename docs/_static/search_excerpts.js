// Search excerpts are cut from each page's [role="main"] element, which in sphinx-book-theme also holds the
// article's header buttons (the colour-mode menu: "System Settings Light Dark"), its table of contents and
// the previous/next links. Those are taken out of the page text before Sphinx picks the excerpt, so that an
// excerpt starts with the page's own prose. Loaded with `defer`, after searchtools.js has defined Search.
(() => {
  if (typeof Search === "undefined" || !Search.htmlToText) return;
  const CHROME = [".bd-header-article", ".article-header-buttons", ".bd-sidebar-secondary",
                  ".prev-next-area", ".bd-footer-article", ".bd-footer-content"];
  const htmlToText = Search.htmlToText;
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(CHROME.join(", ")).forEach((el) => el.remove());
    return htmlToText(doc.documentElement.outerHTML, anchor);
  };
})();
