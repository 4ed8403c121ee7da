//! HTML for mails and pages: text made inert.

/// Text as HTML text or an attribute value: whatever an agent, a tool or a person wrote can
/// add no markup.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn markup_from_agents_and_tools_is_inert() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"more\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;more&quot;"
        );
    }
}
