//! The refund agent of the README as the tests and the benchmark run it: `get_order` runs at
//! once, `issue_refund` over $20 waits for a person; pointed at a model API and a tools
//! service given by URL, whose tools it calls over HTTP or over MCP (the demo's own files,
//! `examples/agents/refunds.toml` and `refunds-mcp.toml`, use the scripted model and the demo
//! service's fixed port).

/// The agent file, for a model API of `provider` at `model_url` and the tools at `tools_url`.
pub fn refunds_agent(provider: &str, model_url: &str, tools_url: &str) -> String {
    format!(
        r#"{}
[[tools]]
name = "get_order"
description = "Look up an order by id: status, amount in USD, payments."
input_schema = {{ type = "object", properties = {{ order_id = {{ type = "string" }} }}, required = ["order_id"] }}
http = {{ url = "{tools_url}/orders/lookup" }}
approval = "never"

[[tools]]
name = "issue_refund"
description = "Refund an amount in USD for an order."
input_schema = {{ type = "object", properties = {{ order_id = {{ type = "string", title = "Order" }}, amount = {{ type = "number", title = "Amount", description = "In US dollars.", exclusiveMinimum = 0, maximum = 500 }}, reason = {{ type = "string", title = "Reason", description = "What the customer is told.", maxLength = 500 }} }}, required = ["order_id", "amount", "reason"] }}
http = {{ url = "{tools_url}/refunds" }}
{REFUND_APPROVAL}"#,
        header(provider, model_url)
    )
}

/// The same agent taking its tools from the demo service's MCP endpoint at `mcp_url`: the
/// server is trusted, so `get_order`, which it says is read-only, runs at once; `issue_refund`
/// has the agent's own policy.
pub fn refunds_mcp_agent(provider: &str, model_url: &str, mcp_url: &str) -> String {
    format!(
        r#"{}
[[mcp_servers]]
name = "shop"
url = "{mcp_url}"
trusted = true

[[tools]]
name = "issue_refund"
mcp = "shop"
{REFUND_APPROVAL}"#,
        header(provider, model_url)
    )
}

fn header(provider: &str, model_url: &str) -> String {
    format!(
        r#"
name = "refunds"
system = "You are a support agent for an online store. Investigate before acting."
max_turns = 10

[model]
provider = "{provider}"
name = "fake-model"
max_tokens = 1024
base_url = "{model_url}"
"#
    )
}

/// The refund's policy; last in the file, so a test can add lines to it.
const REFUND_APPROVAL: &str = r#"risk = "costly"
[tools.approval]
when = "input.amount > 20.0"
reason = "Refund of ${{ input.amount }} moves money"
summary = "Refund ${{ input.amount }} for order {{ input.order_id }}"
"#;
