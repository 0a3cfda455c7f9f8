//! Recognises the XML-ish markup the model writes around reasoning and tool calls.
//!
//! The scanner is deliberately forgiving about the spellings models drift into
//! (`<function=x>`, `<function name="x">`, `<function = x >`, zero-width spaces inside the
//! tag as in `<\u{200B}tool_call>`), and it is incremental: when the text ends in the middle of
//! something that could still become a wanted tag it answers [`Scan::NeedMore`], so a
//! streaming caller holds those bytes back instead of leaking half a tag into the output.

/// Tags the output parser cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TagName {
    Think,
    ToolCall,
    Function,
    Parameter,
}

impl TagName {
    fn ident(self) -> &'static str {
        match self {
            TagName::Think => "think",
            TagName::ToolCall => "tool_call",
            TagName::Function => "function",
            TagName::Parameter => "parameter",
        }
    }

    /// `<function=NAME>` and `<parameter=NAME>` carry a name; the others never do.
    fn takes_name(self) -> bool {
        matches!(self, TagName::Function | TagName::Parameter)
    }
}

/// One tag the caller is looking for: opening or closing, and which one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Want {
    pub closing: bool,
    pub name: TagName,
}

pub(crate) const fn open(name: TagName) -> Want {
    Want {
        closing: false,
        name,
    }
}

pub(crate) const fn close(name: TagName) -> Want {
    Want {
        closing: true,
        name,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tag {
    pub closing: bool,
    pub name: TagName,
    /// The NAME of `<function=NAME>` / `<parameter=NAME>`, trimmed and unquoted.
    pub attr: Option<String>,
    /// Bytes the tag occupies in the scanned text.
    pub len: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scan {
    Tag(Tag),
    /// The `<` does not start any wanted tag; it is ordinary text.
    NotATag,
    /// The text ends while it could still become a wanted tag.
    NeedMore,
}

/// A tag longer than this is not a tag: it bounds how much a streaming caller holds back.
const MAX_TAG_BYTES: usize = 512;

/// Zero-width characters that models (or templates) put inside tags; they never change meaning.
pub(crate) fn is_zero_width(c: char) -> bool {
    matches!(
        c,
        '\u{200B}' | '\u{200C}' | '\u{200D}' | '\u{2060}' | '\u{FEFF}'
    )
}

pub(crate) fn is_blank(c: char) -> bool {
    c.is_whitespace() || is_zero_width(c)
}

/// Scans `text`, which must start with `<`, for one of the `wanted` tags.
///
/// `eof` says that no more text will come, so an incomplete tag is plain text.
pub(crate) fn scan_tag(text: &str, eof: bool, wanted: &[Want]) -> Scan {
    let need_more = if eof { Scan::NotATag } else { Scan::NeedMore };
    let Some(after_lt) = text.strip_prefix('<') else {
        return Scan::NotATag;
    };
    let mut rest = after_lt.trim_start_matches(is_zero_width);
    let closing = rest.starts_with('/');
    if closing {
        rest = rest[1..].trim_start_matches(is_zero_width);
    }
    let candidates: Vec<Want> = wanted
        .iter()
        .copied()
        .filter(|w| w.closing == closing)
        .collect();
    if candidates.is_empty() {
        // `<` or `</` at the very end could still be followed by a wanted tag of the other kind.
        return if rest.is_empty() && !closing && wanted.iter().any(|w| w.closing) {
            need_more
        } else {
            Scan::NotATag
        };
    }
    if rest.is_empty() {
        return need_more;
    }

    let ident_len = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let ident = &rest[..ident_len];
    if ident_len == rest.len() {
        // The identifier may continue in the next chunk.
        let could_grow = candidates.iter().any(|w| w.name.ident().starts_with(ident));
        return if could_grow { need_more } else { Scan::NotATag };
    }
    let Some(want) = candidates.iter().find(|w| w.name.ident() == ident) else {
        return Scan::NotATag;
    };
    let after_ident = &rest[ident_len..];

    // Everything up to `>` is the tag's tail: empty (plus blanks) or a name assignment.
    let Some(gt) = after_ident.find(['>', '<', '\n']) else {
        let consumed = text.len();
        return if consumed > MAX_TAG_BYTES {
            Scan::NotATag
        } else {
            need_more
        };
    };
    if !after_ident[gt..].starts_with('>') {
        return Scan::NotATag;
    }
    let tail = &after_ident[..gt];
    let len = text.len() - after_ident.len() + gt + 1;
    if len > MAX_TAG_BYTES {
        return Scan::NotATag;
    }
    let attr = if want.name.takes_name() && !closing {
        match parse_name_assignment(tail) {
            Some(name) => Some(name),
            None => return Scan::NotATag,
        }
    } else if tail.chars().all(is_blank) {
        None
    } else {
        return Scan::NotATag;
    };
    Scan::Tag(Tag {
        closing,
        name: want.name,
        attr,
        len,
    })
}

/// Parses the part of `<function…>` after the identifier: `=NAME`, `= "NAME"`, ` name="NAME"`.
fn parse_name_assignment(tail: &str) -> Option<String> {
    let tail = tail.trim_matches(is_blank);
    let value = if let Some(v) = tail.strip_prefix('=') {
        v
    } else {
        let v = tail.strip_prefix("name")?.trim_start_matches(is_blank);
        v.strip_prefix('=')?
    };
    let value = value.trim_matches(is_blank);
    let unquoted = strip_quotes(value).trim_matches(is_blank);
    if unquoted.is_empty() {
        None
    } else {
        Some(unquoted.to_string())
    }
}

fn strip_quotes(value: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL_TAGS: [Want; 3] = [
        open(TagName::ToolCall),
        close(TagName::ToolCall),
        open(TagName::Function),
    ];

    fn tag(text: &str) -> Tag {
        match scan_tag(text, false, &CALL_TAGS) {
            Scan::Tag(t) => t,
            other => panic!("{text:?} scanned as {other:?}"),
        }
    }

    #[test]
    fn plain_and_zero_width_spellings() {
        assert_eq!(tag("<tool_call>x").len, "<tool_call>".len());
        let zw = "<\u{200B}tool_call>";
        assert_eq!(tag(zw).len, zw.len());
        let zw_close = "</\u{200B}tool_call>";
        assert!(tag(zw_close).closing);
    }

    #[test]
    fn function_name_variants() {
        for text in [
            "<function=read_file>",
            "<function = read_file >",
            "<function name=\"read_file\">",
            "<function=\"read_file\">",
        ] {
            assert_eq!(tag(text).attr.as_deref(), Some("read_file"), "{text}");
        }
    }

    #[test]
    fn prefixes_wait_and_others_are_text() {
        for prefix in [
            "<",
            "<tool_ca",
            "</",
            "</tool_call",
            "<function=rea",
            "<\u{200B}",
        ] {
            assert_eq!(
                scan_tag(prefix, false, &CALL_TAGS),
                Scan::NeedMore,
                "{prefix}"
            );
            assert_eq!(
                scan_tag(prefix, true, &CALL_TAGS),
                Scan::NotATag,
                "{prefix}"
            );
        }
        for text in [
            "<div>",
            "< b",
            "<tool_callx>",
            "<function>",
            "<function=a\nb>",
        ] {
            assert_eq!(scan_tag(text, false, &CALL_TAGS), Scan::NotATag, "{text}");
        }
    }
}
