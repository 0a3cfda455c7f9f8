// A small, safe Markdown renderer: the text is HTML-escaped first, then only a fixed set of tags is
// produced (code blocks, inline code, bold/italic, lists, headings, links with http(s)/mailto or
// relative targets). Nothing from the input can become a tag or an attribute of its own.
"use strict";

(function () {
  function escapeHtml(text) {
    return String(text)
      .replace(/&/g, "&amp;")
      .replace(/</g, "&lt;")
      .replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;")
      .replace(/'/g, "&#39;");
  }

  // The target of a link, already escaped, or null for schemes that could run code.
  function safeUrl(url) {
    const u = url.trim();
    if (/^(https?:\/\/|mailto:)/i.test(u) || /^[/#?]/.test(u)) {
      return u;
    }
    return null;
  }

  // Spans that must not be touched by later rules are swapped for \u0000N\u0000 markers.
  function inline(text) {
    const held = [];
    const hold = (html) => "\u0000" + (held.push(html) - 1) + "\u0000";
    let t = text.replace(/`([^`]+)`/g, (_, code) => hold("<code>" + code + "</code>"));
    t = t.replace(/\[([^\]]+)\]\(([^)\s]+)\)/g, (whole, label, url) => {
      const target = safeUrl(url);
      if (target === null) {
        return whole;
      }
      return hold(
        '<a href="' + target + '" target="_blank" rel="noopener noreferrer">' + emphasis(label) + "</a>"
      );
    });
    t = emphasis(t);
    return t.replace(/\u0000(\d+)\u0000/g, (_, i) => held[Number(i)]);
  }

  function emphasis(text) {
    return text
      .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/__([^_]+)__/g, "<strong>$1</strong>")
      .replace(/\*([^*\s][^*]*)\*/g, "<em>$1</em>")
      .replace(/(^|[^\w])_([^_\s][^_]*)_(?!\w)/g, "$1<em>$2</em>");
  }

  const FENCE = /^\s*```\s*([\w+-]*)\s*$/;
  const HEADING = /^(#{1,6})\s+(.*)$/;
  const RULE = /^\s*(-{3,}|\*{3,}|_{3,})\s*$/;
  const BULLET = /^\s*[-*+]\s+(.*)$/;
  const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;

  function render(source) {
    const lines = escapeHtml(String(source).replace(/\u0000/g, "")).split(/\r?\n/);
    const out = [];
    let para = [];
    let list = null;
    const flushPara = () => {
      if (para.length) {
        out.push("<p>" + inline(para.join("\n")).replace(/\n/g, "<br>") + "</p>");
      }
      para = [];
    };
    const flushList = () => {
      if (list) {
        const items = list.items.map((i) => "<li>" + inline(i) + "</li>").join("");
        out.push("<" + list.tag + ">" + items + "</" + list.tag + ">");
      }
      list = null;
    };
    const flush = () => {
      flushPara();
      flushList();
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = FENCE.exec(line);
      if (fence) {
        flush();
        const code = [];
        for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) {
          code.push(lines[i]);
        }
        const cls = fence[1] ? ' class="lang-' + fence[1] + '"' : "";
        out.push("<pre><code" + cls + ">" + code.join("\n") + "</code></pre>");
        continue;
      }
      const heading = HEADING.exec(line);
      if (heading) {
        flush();
        const n = heading[1].length;
        out.push("<h" + n + ">" + inline(heading[2]) + "</h" + n + ">");
        continue;
      }
      if (RULE.test(line)) {
        flush();
        out.push("<hr>");
        continue;
      }
      const bullet = BULLET.exec(line);
      const numbered = bullet ? null : NUMBERED.exec(line);
      if (bullet || numbered) {
        flushPara();
        const tag = bullet ? "ul" : "ol";
        if (!list || list.tag !== tag) {
          flushList();
          list = { tag: tag, items: [] };
        }
        list.items.push((bullet || numbered)[1]);
        continue;
      }
      if (line.trim() === "") {
        flush();
        continue;
      }
      if (list && /^\s+/.test(line)) {
        list.items[list.items.length - 1] += " " + line.trim();
        continue;
      }
      flushList();
      para.push(line);
    }
    flush();
    return out.join("\n");
  }

  window.strataMarkdown = { render: render, escapeHtml: escapeHtml };
})();
