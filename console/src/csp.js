// The page's Content-Security-Policy refuses inline <style> elements without this response's nonce.
// xterm.js creates a few at run time (fonts, theme colours, cell sizes) and has no option to stamp
// them, so every <style> element this document creates gets the nonce the page was served with
// (the script element carries it; the browser hides the attribute but keeps the property).
// Imported first by app.js, before anything can create a terminal.

const nonce = document.querySelector('script[nonce]')?.nonce || '';
const createElement = document.createElement.bind(document);

if (nonce) {
  document.createElement = (tagName, options) => {
    const element = createElement(tagName, options);
    if (element instanceof HTMLStyleElement) element.nonce = nonce;
    return element;
  };
}
