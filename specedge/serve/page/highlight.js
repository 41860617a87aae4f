// specedge's chat page: a small syntax highlighter for the languages models write most (Python,
// JavaScript/TypeScript, JSON, shell, C/C++, C#, Java, Kotlin, Go, Rust, Swift, Ruby, PHP, SQL, CSS,
// HTML/XML, YAML). One scanner, a table per language: comments, strings, numbers, keywords, literals,
// types, function names, decorators. It returns [start, end, kind] ranges over the code, so the page
// can colour each character by where it came from as well. No dependencies.
"use strict";

(function () {
  const words = (text) => new Set(text.split(/\s+/).filter(Boolean));
  const C_LIKE = { line: ["//"], block: [["/*", "*/"]], strings: ['"'], chars: true };
  const LANGS = {
    python: {
      line: ["#"], block: [], strings: ['"""', "'''", '"', "'"], prefixes: "rbfuRBFU", decorators: true,
      keywords: words(`and as assert async await break class continue def del elif else except finally for from
        global if import in is lambda match case nonlocal not or pass raise return try while with yield`),
      literals: words("True False None self cls"),
      types: words(`int float str bool list dict set tuple bytes object type Exception ValueError TypeError
        KeyError IndexError`),
      builtins: words("print len range enumerate zip map filter sorted sum min max abs open isinstance super"),
    },
    javascript: {
      ...C_LIKE, strings: ['"', "'", "`"], chars: false, decorators: true,
      keywords: words(`async await break case catch class const continue debugger default delete do else export
        extends finally for from function if import in instanceof let new of return static super switch this
        throw try typeof var void while with yield interface type implements enum public private protected
        readonly abstract declare namespace as keyof`),
      literals: words("true false null undefined NaN Infinity"),
      types: words("string number boolean any unknown never void object Promise Array Map Set"),
      builtins: words("console document window JSON Math Object"),
    },
    json: { line: [], block: [], strings: ['"'], keys: true, keywords: words(""), literals: words("true false null") },
    bash: {
      line: ["#"], block: [], strings: ['"', "'"], variables: true, commentNeedsSpace: true,
      keywords: words(`if then else elif fi for while until do done case esac in function return local export
        readonly declare source exit break continue`),
      literals: words("true false"),
      builtins: words("echo cd ls cat grep sed awk printf read test set unset shift pip python git curl sudo"),
    },
    c: {
      ...C_LIKE, preprocessor: true,
      keywords: words(`auto break case const continue default do else enum extern for goto if inline register
        restrict return sizeof static struct switch typedef union volatile while class namespace template
        typename public private protected virtual override new delete using try catch throw operator friend
        constexpr noexcept nullptr this auto`),
      literals: words("true false NULL nullptr"),
      types: words(`void char short int long float double signed unsigned bool size_t int8_t int16_t int32_t
        int64_t uint8_t uint16_t uint32_t uint64_t std string vector map`),
    },
    csharp: {
      ...C_LIKE, decorators: false,
      keywords: words(`abstract as base break case catch class const continue default delegate do else enum event
        explicit extern finally fixed for foreach goto if implicit in interface internal is lock namespace new
        operator out override params private protected public readonly ref return sealed sizeof static struct
        switch this throw try typeof unchecked unsafe using virtual volatile while var async await get set`),
      literals: words("true false null"),
      types: words("bool byte char decimal double float int long object sbyte short string uint ulong ushort void"),
    },
    java: {
      ...C_LIKE, decorators: true,
      keywords: words(`abstract assert break case catch class const continue default do else enum extends final
        finally for goto if implements import instanceof interface native new package private protected public
        return static strictfp super switch synchronized this throw throws transient try volatile while var
        record fun val when object companion data sealed override open internal lateinit suspend`),
      literals: words("true false null"),
      types: words("boolean byte char double float int long short void String Integer List Map Unit Any"),
    },
    go: {
      ...C_LIKE, strings: ['"', "`"],
      keywords: words(`break case chan const continue default defer else fallthrough for func go goto if import
        interface map package range return select struct switch type var`),
      literals: words("true false nil iota"),
      types: words(`bool byte complex64 complex128 error float32 float64 int int8 int16 int32 int64 rune string
        uint uint8 uint16 uint32 uint64 uintptr any`),
      builtins: words("append cap close copy delete len make new panic print println recover fmt"),
    },
    rust: {
      ...C_LIKE, macros: true,
      keywords: words(`as async await break const continue crate dyn else enum extern fn for if impl in let loop
        match mod move mut pub ref return self Self static struct super trait type unsafe use where while`),
      literals: words("true false None Some Ok Err"),
      types: words("bool char f32 f64 i8 i16 i32 i64 i128 isize str u8 u16 u32 u64 u128 usize String Vec Option Result Box"),
    },
    swift: {
      ...C_LIKE, decorators: true,
      keywords: words(`as associatedtype break case catch class continue default defer do else enum extension
        fallthrough fileprivate for func guard if import in init inout internal is let mutating open operator
        private protocol public repeat rethrows return self static struct subscript super switch throw throws try
        typealias var where while async await`),
      literals: words("true false nil"),
      types: words("Int Double Float String Bool Character Array Dictionary Set Void Any"),
    },
    ruby: {
      line: ["#"], block: [["=begin", "=end"]], strings: ['"', "'"], variables: true,
      keywords: words(`alias and begin break case class def defined do else elsif end ensure for if in module next
        not or redo rescue retry return self super then undef unless until when while yield require attr_reader
        attr_accessor puts`),
      literals: words("true false nil"),
    },
    php: {
      ...C_LIKE, line: ["//", "#"], strings: ['"', "'"], chars: false, variables: true,
      keywords: words(`abstract and array as break callable case catch class clone const continue declare default
        do echo else elseif empty enddeclare endfor endforeach endif endswitch endwhile extends final finally fn
        for foreach function global goto if implements include instanceof interface isset list namespace new or
        print private protected public require return static switch throw trait try unset use var while yield`),
      literals: words("true false null TRUE FALSE NULL"),
    },
    sql: {
      line: ["--"], block: [["/*", "*/"]], strings: ["'", '"'], caseless: true,
      keywords: words(`select from where and or not insert into values update set delete create table drop alter
        add primary key foreign references join left right inner outer full on as group by order having limit
        offset distinct union all exists in between like is case when then else end index view with returning
        asc desc default unique check constraint`),
      literals: words("null true false"),
      types: words("int integer bigint smallint text varchar char boolean date timestamp numeric real serial float"),
    },
    css: {
      line: [], block: [["/*", "*/"]], strings: ['"', "'"], atRules: true, keywords: words("!important"),
      literals: words(""),
    },
    yaml: { line: ["#"], block: [], strings: ['"', "'"], yamlKeys: true, commentNeedsSpace: true,
            keywords: words(""), literals: words("true false null yes no on off ~") },
  };
  const ALIASES = {
    py: "python", python3: "python", js: "javascript", jsx: "javascript", mjs: "javascript", ts: "javascript",
    tsx: "javascript", typescript: "javascript", node: "javascript", jsonc: "json", json5: "json",
    sh: "bash", shell: "bash", zsh: "bash", console: "bash", shellsession: "bash", ps1: "bash", powershell: "bash",
    "c++": "c", cpp: "c", cc: "c", cxx: "c", h: "c", hpp: "c", objc: "c", cs: "csharp", "c#": "csharp",
    kotlin: "java", kt: "java", scala: "java", golang: "go", rs: "rust", rb: "ruby", postgres: "sql",
    postgresql: "sql", mysql: "sql", sqlite: "sql", scss: "css", less: "css", yml: "yaml", toml: "yaml",
    ini: "yaml", html: "markup", xml: "markup", svg: "markup", vue: "markup",
  };

  function language(name) {
    const key = (name || "").toLowerCase();
    const found = ALIASES[key] || key;
    return found === "markup" || LANGS[found] ? found : "";
  }

  const IDENT = /[A-Za-z_][\w]*/y;
  const NUMBER = /(?:0[xX][\da-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|(?:\d[\d_]*)?\.?\d[\d_]*(?:[eE][+-]?\d+)?)[a-zA-Z]*/y;

  function scan(code, lang) {
    const out = [];
    const add = (start, end, kind) => { if (end > start) out.push([start, end, kind]); };
    let i = 0;
    let lineStart = true, after = "";  // after: the keyword before an identifier (def, class, fn...)
    const n = code.length;
    const startsAt = (s, at) => code.startsWith(s, at);
    while (i < n) {
      const ch = code[i];
      if (ch === "\n") { lineStart = true; i++; continue; }
      if (ch === " " || ch === "\t" || ch === "\r") { i++; continue; }
      const first = lineStart;
      lineStart = false;
      // comments
      const block = lang.block.find(([open]) => startsAt(open, i) && (open[0] !== "=" || first));
      if (block) {
        const close = code.indexOf(block[1], i + block[0].length);
        const end = close < 0 ? n : close + block[1].length;
        add(i, end, "com"); i = end; continue;
      }
      const line = lang.line.find((m) => startsAt(m, i));
      if (line && (!lang.commentNeedsSpace || i === 0 || /\s/.test(code[i - 1]))) {
        const nl = code.indexOf("\n", i);
        const end = nl < 0 ? n : nl;
        add(i, end, "com"); i = end; continue;
      }
      if (lang.preprocessor && first && ch === "#") {
        const nl = code.indexOf("\n", i);
        const end = nl < 0 ? n : nl;
        add(i, end, "meta"); i = end; continue;
      }
      // strings (with a prefix such as Python's r"" f"" b"")
      let start = i, at = i;
      if (lang.prefixes) while (at < n && at - i < 2 && lang.prefixes.includes(code[at])) at++;
      const quote = lang.strings.find((q) => startsAt(q, at));
      if (quote && (at === i || /["']/.test(code[at]))) {
        if (quote === "'" && lang.chars) {  // a char literal, or a Rust lifetime ('a)
          const close = code.slice(at + 1, at + 4).search(/(?<!\\)'/);
          if (close < 0) { add(i, i + 1, "kw"); i++; continue; }
          const end = at + 2 + close;
          add(start, end, "str"); i = end; continue;
        }
        let j = at + quote.length;
        const multi = quote.length === 3 || quote === "`";
        while (j < n && !startsAt(quote, j) && (multi || code[j] !== "\n")) j += code[j] === "\\" ? 2 : 1;
        const end = Math.min(n, j < n && startsAt(quote, j) ? j + quote.length : j);
        const kind = lang.keys && /^\s*:/.test(code.slice(end, end + 20)) ? "prop" : "str";
        add(start, end, kind); i = end; continue;
      }
      // decorators, annotations, macros, variables, at-rules
      if ((lang.decorators || lang.atRules) && ch === "@") {
        IDENT.lastIndex = i + 1;
        const m = IDENT.exec(code);
        if (m) { add(i, i + 1 + m[0].length, "meta"); i += 1 + m[0].length; continue; }
      }
      if (lang.variables && (ch === "$" || (ch === "@" && !lang.decorators))) {
        const m = /\$\{[^}\n]*\}|[$@]{1,2}[A-Za-z_\d#?@*!-]\w*/y;
        m.lastIndex = i;
        const v = m.exec(code);
        if (v) { add(i, i + v[0].length, "var"); i += v[0].length; continue; }
      }
      // numbers
      if (/[\d.]/.test(ch) && (i === 0 || !/[\w$]/.test(code[i - 1]))) {
        NUMBER.lastIndex = i;
        const m = NUMBER.exec(code);
        if (m && m[0] && /\d/.test(m[0])) { add(i, i + m[0].length, "num"); i += m[0].length; continue; }
      }
      if (lang.atRules && ch === "#" && /[\da-fA-F]{3}/.test(code.slice(i + 1, i + 4))) {
        const m = /#[\da-fA-F]{3,8}\b/y;
        m.lastIndex = i;
        const c = m.exec(code);
        if (c) { add(i, i + c[0].length, "num"); i += c[0].length; continue; }
      }
      // words
      IDENT.lastIndex = i;
      const m = /[A-Za-z_]/.test(ch) ? IDENT.exec(code) : null;
      if (m) {
        const word = m[0], end = i + word.length;
        const key = lang.caseless ? word.toLowerCase() : word;
        const next = code.slice(end).match(/^\s*(.)/);
        if (lang.yamlKeys && first && next && next[1] === ":") add(i, end, "prop");
        else if (lang.keywords.has(key)) add(i, end, "kw");
        else if (lang.literals.has(key)) add(i, end, "lit");
        else if (lang.macros && code[end] === "!") { add(i, end + 1, "fn"); i = end + 1; after = ""; continue; }
        else if (/^(def|fn|func|function|fun)$/.test(after)) add(i, end, "fn");
        else if (/^(class|struct|enum|trait|interface|type|impl|record|object)$/.test(after)) add(i, end, "type");
        else if (lang.types && lang.types.has(key)) add(i, end, "type");
        else if (next && next[1] === "(") add(i, end, lang.builtins && lang.builtins.has(key) ? "builtin" : "fn");
        else if (lang.builtins && lang.builtins.has(key)) add(i, end, "builtin");
        else if (lang.types && /^[A-Z][a-z]\w*$/.test(word)) add(i, end, "type");
        after = key;
        i = end;
        continue;
      }
      after = "";
      i++;
    }
    return out;
  }

  function markup(code) {
    const out = [];
    const add = (s, e, k) => { if (e > s) out.push([s, e, k]); };
    const re = /<!--[\s\S]*?(?:-->|$)|<\/?[A-Za-z][\w:.-]*|\/?>|"[^"]*"?|'[^']*'?|[\w:.-]+(?==)|&\w+;/g;
    let inTag = false, m;
    while ((m = re.exec(code))) {
      const t = m[0], s = m.index, e = s + t.length;
      if (t.startsWith("<!--")) add(s, e, "com");
      else if (t[0] === "<") { add(s, e, "tag"); inTag = true; }
      else if (t.endsWith(">")) { add(s, e, "tag"); inTag = false; }
      else if (inTag && /^["']/.test(t)) add(s, e, "str");
      else if (inTag && /^[\w:.-]+$/.test(t)) add(s, e, "prop");
      else if (t[0] === "&") add(s, e, "lit");
    }
    return out;
  }

  // [start, end, kind] ranges of `code` in `lang` (none for a language it does not know)
  function tokens(code, name) {
    const lang = language(name);
    if (!lang) return [];
    return lang === "markup" ? markup(code) : scan(code, LANGS[lang]);
  }

  window.SpecedgeHighlight = { tokens, language };
})();
