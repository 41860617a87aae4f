// specedge's chat page: a small Markdown renderer for answers (the common subset models write:
// headings, paragraphs, emphasis, inline code, fenced code blocks, lists, block quotes, tables, rules,
// links). It builds DOM nodes, never HTML strings, so an answer's text can hold no markup. Every piece
// of text it shows keeps its offset in the answer, so each character can also be coloured by where its
// token came from (drafted and accepted, or the target's own). Code blocks are highlighted
// (highlight.js) and carry a copy button. Unfinished constructs (a code fence still streaming) render
// as far as they go. No dependencies.
"use strict";

(function () {
  const el = (tag, cls) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    return node;
  };

  // Where each character of the answer came from: runs of [end offset, drafted?], in order.
  class Origins {
    constructor(runs) { this.runs = runs || []; }
    // [[start, end, drafted], ...] covering [start, end)
    split(start, end) {
      const out = [];
      let from = start;
      for (const [runEnd, drafted] of this.runs) {
        if (runEnd <= from) continue;
        const to = Math.min(end, runEnd);
        out.push([from, to, drafted]);
        from = to;
        if (from >= end) break;
      }
      if (from < end) out.push([from, end, false]);
      return out;
    }
  }

  // Text of the answer between source offsets, as nodes: spans by origin when origins are shown.
  class Writer {
    constructor(src, origins, show) { this.src = src; this.origins = origins; this.show = show; }
    text(parent, start, end) {
      if (end <= start) return;
      if (!this.show) { parent.appendChild(document.createTextNode(this.src.slice(start, end))); return; }
      for (const [s, e, drafted] of this.origins.split(start, end)) {
        const span = el("span", drafted ? "drafted" : "own");
        span.textContent = this.src.slice(s, e);
        parent.appendChild(span);
      }
    }
  }

  // A run of text made of pieces of the source (lines without their indentation): maps its own
  // offsets back to the source's.
  class Piece {
    constructor(src, ranges) {
      this.ranges = ranges;  // [[srcStart, srcEnd], ...], joined by "\n"
      this.text = ranges.map(([s, e]) => src.slice(s, e)).join("\n");
      this.starts = [];
      let at = 0;
      for (const [s, e] of ranges) { this.starts.push(at); at += e - s + 1; }
    }
    // write [a, b) of this text, source offsets and origins kept, newlines as they are
    write(w, parent, a, b) {
      this.ranges.forEach(([s, e], k) => {
        const from = Math.max(a, this.starts[k]), to = Math.min(b, this.starts[k] + (e - s));
        if (from < to) w.text(parent, s + from - this.starts[k], s + to - this.starts[k]);
        const nl = this.starts[k] + (e - s);
        if (k < this.ranges.length - 1 && nl >= a && nl < b) parent.appendChild(document.createTextNode("\n"));
      });
    }
  }

  // --- inline ------------------------------------------------------------------------------------

  const PUNCT = /[!-/:-@[-`{-~]/;

  function inline(w, piece, parent, a, b, breaks) {
    const t = piece.text;
    let plain = a;
    const flush = (to) => {
      if (to <= plain) return;
      if (!breaks) { piece.write(w, parent, plain, to); return; }
      let from = plain;
      for (let k = plain; k < to; k++) {
        if (t[k] === "\n") { piece.write(w, parent, from, k); parent.appendChild(el("br")); from = k + 1; }
      }
      piece.write(w, parent, from, to);
    };
    let i = a;
    while (i < b) {
      const ch = t[i];
      if (ch === "\\" && i + 1 < b && PUNCT.test(t[i + 1])) {
        flush(i); plain = i + 1; i += 2; continue;
      }
      if (ch === "`") {
        let n = 1;
        while (t[i + n] === "`") n++;
        const fence = "`".repeat(n);
        let close = t.indexOf(fence, i + n);
        while (close >= 0 && close < b && t[close + n] === "`") close = t.indexOf(fence, close + n + 1);
        if (close >= 0 && close + n <= b) {
          flush(i);
          const code = el("code");
          let s = i + n, e = close;
          if (e - s >= 2 && t[s] === " " && t[e - 1] === " ") { s++; e--; }
          piece.write(w, code, s, e);
          parent.appendChild(code);
          i = plain = close + n;
          continue;
        }
        i += n;
        continue;
      }
      if (ch === "*" || ch === "_" || ch === "~") {
        let n = 1;
        while (t[i + n] === ch && n < 3) n++;
        const intraword = ch === "_" && i > a && /\w/.test(t[i - 1]);
        const opens = i + n < b && !/\s/.test(t[i + n]) && !intraword && (ch !== "~" || n === 2);
        if (opens) {
          const marker = ch.repeat(n);
          let close = t.indexOf(marker, i + n);
          while (close >= 0 && close < b &&
                 (/\s/.test(t[close - 1]) || t[close + n] === ch || (ch === "_" && /\w/.test(t[close + n] || "")))) {
            close = t.indexOf(marker, close + 1);
          }
          if (close > i + n && close + n <= b) {
            flush(i);
            const tag = ch === "~" ? "del" : n === 1 ? "em" : "strong";
            let node = el(tag);
            if (n === 3) { const inner = el("em"); node.appendChild(inner); parent.appendChild(node); node = inner; }
            else parent.appendChild(node);
            inline(w, piece, node, i + n, close, breaks);
            i = plain = close + n;
            continue;
          }
        }
        i += n;
        continue;
      }
      if (ch === "[" || (ch === "!" && t[i + 1] === "[")) {
        const open = ch === "!" ? i + 1 : i;
        const m = /^\[([^\]\n]*)\]\(\s*<?([^\s()<>]+)>?(?:\s+"[^"]*")?\s*\)/.exec(t.slice(open, b));
        if (m) {
          flush(i);
          const url = m[2];
          const safe = /^(?:https?:\/\/|mailto:)/i.test(url);
          const link = el(safe ? "a" : "span");
          if (safe) { link.href = url; link.target = "_blank"; link.rel = "noopener noreferrer"; }
          inline(w, piece, link, open + 1, open + 1 + m[1].length, breaks);
          if (!m[1]) link.textContent = url;
          parent.appendChild(link);
          i = plain = open + m[0].length;
          continue;
        }
      }
      i++;
    }
    flush(b);
  }

  // --- blocks ------------------------------------------------------------------------------------

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+|$)/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}> ?/;
  const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])([ \t]+|$)/;
  const TABLE_RULE = /^ {0,3}\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  const blank = (src, [s, e]) => !/\S/.test(src.slice(s, e));
  const indent = (src, [s, e]) => src.slice(s, e).match(/^ */)[0].length;

  // lines: [[start, end], ...] of the source (end excludes the newline)
  function blocks(w, src, lines, parent) {
    let k = 0;
    const text = (line) => src.slice(line[0], line[1]);
    while (k < lines.length) {
      const line = lines[k], t = text(line);
      if (blank(src, line)) { k++; continue; }
      let m;
      if ((m = FENCE.exec(t))) {
        const mark = m[1], lang = m[2], pad = indent(src, line);
        const body = [];
        let closed = false;
        k++;
        while (k < lines.length) {
          const u = text(lines[k]);
          const close = u.trim();
          if (close.startsWith(mark[0].repeat(mark.length)) && /^[`~]+$/.test(close) && indent(src, lines[k]) <= pad + 3) {
            k++;
            closed = true;
            break;
          }
          const strip = Math.min(pad, indent(src, lines[k]));
          body.push([lines[k][0] + strip, lines[k][1]]);
          k++;
        }
        while (!closed && body.length && blank(src, body[body.length - 1])) body.pop();  // still streaming
        parent.appendChild(codeBlock(w, src, body, lang));
        continue;
      }
      if ((m = HEADING.exec(t))) {
        const h = el(`h${Math.min(6, m[1].length + 2)}`);
        const content = t.slice(m[0].length).replace(/[ \t]+#+[ \t]*$/, "").replace(/[ \t]+$/, "");
        const piece = new Piece(src, [[line[0] + m[0].length, line[0] + m[0].length + content.length]]);
        inline(w, piece, h, 0, piece.text.length, false);
        parent.appendChild(h);
        k++;
        continue;
      }
      if (RULE.test(t)) { parent.appendChild(el("hr")); k++; continue; }
      if (QUOTE.test(t)) {
        const inner = [];
        while (k < lines.length && !blank(src, lines[k]) && QUOTE.test(text(lines[k]))) {
          const q = QUOTE.exec(text(lines[k]))[0].length;
          inner.push([lines[k][0] + q, lines[k][1]]);
          k++;
        }
        const quote = el("blockquote");
        blocks(w, src, inner, quote);
        parent.appendChild(quote);
        continue;
      }
      if ((m = ITEM.exec(t))) {
        k = list(w, src, lines, k, parent);
        continue;
      }
      if (t.includes("|") && k + 1 < lines.length && TABLE_RULE.test(text(lines[k + 1])) &&
          text(lines[k + 1]).includes("-")) {
        k = table(w, src, lines, k, parent);
        continue;
      }
      // a paragraph: until a blank line or another block
      const para = [];
      while (k < lines.length && !blank(src, lines[k])) {
        const u = text(lines[k]);
        if (para.length && (FENCE.test(u) || HEADING.test(u) || RULE.test(u) || QUOTE.test(u) ||
                            (ITEM.test(u) && indent(src, lines[k]) < 4))) break;
        const lead = indent(src, lines[k]);
        para.push([lines[k][0] + lead, lines[k][1]]);
        k++;
      }
      const p = el("p");
      const piece = new Piece(src, para);
      inline(w, piece, p, 0, piece.text.length, true);
      parent.appendChild(p);
    }
  }

  function list(w, src, lines, k, parent) {
    const text = (line) => src.slice(line[0], line[1]);
    const first = ITEM.exec(text(lines[k]));
    const ordered = /\d/.test(first[2]);
    const base = first[1].length;
    const node = el(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
    while (k < lines.length) {
      const m = ITEM.exec(text(lines[k]));
      if (!m || m[1].length !== base || /\d/.test(m[2]) !== ordered) break;
      const contentIndent = m[0].length;
      const item = [[lines[k][0] + contentIndent, lines[k][1]]];
      k++;
      // the item's other lines: indented past its marker, or lazy paragraph lines, blank lines between
      while (k < lines.length) {
        const u = text(lines[k]);
        if (blank(src, lines[k])) {
          let next = k + 1;
          while (next < lines.length && blank(src, lines[next])) next++;
          if (next < lines.length && indent(src, lines[next]) > base && !(ITEM.test(text(lines[next])) &&
              ITEM.exec(text(lines[next]))[1].length === base)) {
            while (k < next) { item.push([lines[k][0], lines[k][0]]); k++; }
            continue;
          }
          break;
        }
        const lead = indent(src, lines[k]);
        const im = ITEM.exec(u);
        if (im && im[1].length <= base) break;
        if (lead <= base && (FENCE.test(u) || HEADING.test(u) || QUOTE.test(u) || RULE.test(u))) break;
        item.push([lines[k][0] + Math.min(lead, contentIndent), lines[k][1]]);
        k++;
      }
      const li = el("li");
      const loose = item.some((line) => blank(src, line));
      blocks(w, src, item, li);
      if (!loose && li.childNodes.length && li.firstChild.tagName === "P") {  // a tight item: no paragraph margins
        const p = li.firstChild;
        while (p.firstChild) li.insertBefore(p.firstChild, p);
        li.removeChild(p);
      }
      node.appendChild(li);
      while (k < lines.length && blank(src, lines[k])) {  // blank lines between items of one list
        let next = k + 1;
        while (next < lines.length && blank(src, lines[next])) next++;
        const nm = next < lines.length ? ITEM.exec(text(lines[next])) : null;
        if (nm && nm[1].length === base && /\d/.test(nm[2]) === ordered) k = next;
        else break;
      }
    }
    parent.appendChild(node);
    return k;
  }

  function cells(src, [s, e]) {
    const t = src.slice(s, e);
    const out = [];
    let from = 0, tick = false;
    for (let i = 0; i <= t.length; i++) {
      if (t[i] === "`") tick = !tick;
      if (i === t.length || (t[i] === "|" && t[i - 1] !== "\\" && !tick)) { out.push([s + from, s + i]); from = i + 1; }
    }
    if (out.length && !src.slice(out[0][0], out[0][1]).trim()) out.shift();
    if (out.length && !src.slice(out[out.length - 1][0], out[out.length - 1][1]).trim()) out.pop();
    return out.map(([a, b]) => {
      const cell = src.slice(a, b);
      const lead = cell.length - cell.trimStart().length;
      return [a + lead, a + lead + cell.trim().length];
    });
  }

  function table(w, src, lines, k, parent) {
    const align = cells(src, lines[k + 1]).map(([a, b]) => {
      const rule = src.slice(a, b);
      return rule.startsWith(":") && rule.endsWith(":") ? "center" : rule.endsWith(":") ? "right" : "";
    });
    const wrap = el("div", "table");
    const node = el("table");
    const row = (line, tag) => {
      const tr = el("tr");
      cells(src, line).forEach((range, c) => {
        const cell = el(tag);
        if (align[c]) cell.classList.add(`align-${align[c]}`);
        const piece = new Piece(src, [range]);
        inline(w, piece, cell, 0, piece.text.length, false);
        tr.appendChild(cell);
      });
      return tr;
    };
    const head = el("thead");
    head.appendChild(row(lines[k], "th"));
    node.appendChild(head);
    const body = el("tbody");
    k += 2;
    while (k < lines.length && !blank(src, lines[k]) && src.slice(lines[k][0], lines[k][1]).includes("|")) {
      body.appendChild(row(lines[k], "td"));
      k++;
    }
    node.appendChild(body);
    wrap.appendChild(node);
    parent.appendChild(wrap);
    return k;
  }

  function codeBlock(w, src, body, lang) {
    const piece = new Piece(src, body);
    const box = el("div", "code");
    const head = el("div", "code-head");
    const name = el("span", "lang");
    name.textContent = lang || "text";
    const copy = el("button", "copy");
    copy.type = "button";
    copy.textContent = "Copy";
    copy.title = "Copy the code";
    head.append(name, copy);
    const pre = el("pre");
    const code = el("code");
    const known = window.SpecedgeHighlight ? window.SpecedgeHighlight.language(lang) : "";
    if (known) code.className = `language-${known}`;
    code.dataset.code = piece.text;  // what the copy button copies: the code exactly, indentation kept
    let at = 0;
    for (const [s, e, kind] of known ? window.SpecedgeHighlight.tokens(piece.text, known) : []) {
      if (s < at) continue;
      piece.write(w, code, at, s);
      const tok = el("span", `tok-${kind}`);
      piece.write(w, tok, s, e);
      code.appendChild(tok);
      at = e;
    }
    piece.write(w, code, at, piece.text.length);
    pre.appendChild(code);
    box.append(head, pre);
    return box;
  }

  // Render `src` (an answer's Markdown) into `parent`, replacing what it held. origins: runs of
  // [end offset, drafted?] saying where each character came from; show: colour them.
  function render(src, parent, origins, show) {
    const lines = [];
    let s = 0;
    for (;;) {
      const nl = src.indexOf("\n", s);
      if (nl < 0) { lines.push([s, src.length]); break; }
      lines.push([s, src[nl - 1] === "\r" ? nl - 1 : nl]);
      s = nl + 1;
    }
    const frag = document.createDocumentFragment();
    blocks(new Writer(src, new Origins(origins), !!show), src, lines, frag);
    parent.replaceChildren(frag);
  }

  window.SpecedgeMarkdown = { render };
})();
