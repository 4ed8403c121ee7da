//! The refund agent of the README as the tests and the benchmark run it: `get_order` runs at
//! once, `issue_refund` over $20 waits for a person; pointed at a model API and a tools
//! service given by URL (the demo's own file, `examples/agents/refunds.toml`, uses the
//! scripted model and the demo service's fixed port).

/// The agent file, for a model API of `provider` at `model_url` and the tools at `tools_url`.
pub fn refunds_agent(provider: &str, model_url: &str, tools_url: &str) -> String {
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
[tools.approval]
when = "input.amount > 20.0"
reason = "Refund of ${{{{ input.amount }}}} moves money"
summary = "Refund ${{{{ input.amount }}}} for order {{{{ input.order_id }}}}"
"#
    )
}
