//! The demo tools over MCP: `get_order` and `issue_refund` at `/mcp` of the demo tools
//! service (Streamable HTTP), answered by the same code and from the same ledger as its HTTP
//! endpoints. A call carries its idempotency key and receipt in `_meta`
//! (`countersign.dev/idempotency_key`, `countersign.dev/receipt`), and the ledger counts it
//! under `mcp:` and the tool's name, so tests can tell MCP calls from HTTP requests.
//!
//! The tools' names, descriptions and input schemas are those of the demo agent's own file,
//! `examples/agents/refunds.toml`, read from it, so the two cannot drift apart.

use crate::demo_ledger::{DemoVerifier, Outcome, Request, Service};
use countersign_receipt::mcp::{META_IDEMPOTENCY_KEY, META_RECEIPT, META_RECEIPT_REFUSED};
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;

/// Tools per `tools/list` page. One, so that every client of the demo has to follow
/// `nextCursor` to see both tools: paging is exercised wherever the demo runs.
const PAGE_SIZE: usize = 1;

/// The demo agent's file, whose tools the service serves.
const AGENT_FILE: &str = include_str!("../../examples/agents/refunds.toml");

/// The MCP endpoint of the demo tools, to nest at `/mcp`.
pub(crate) fn service(service: Service) -> StreamableHttpService<DemoMcp, LocalSessionManager> {
    let handler = DemoMcp {
        service,
        tools: Arc::new(tools()),
    };
    // No `Host` check: the demo is reached under whatever name the network gives its host
    // (the multi-host test's containers reach it through their network's gateway), as its
    // HTTP endpoints are.
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    StreamableHttpService::new(move || Ok(handler.clone()), Default::default(), config)
}

/// One `tools/list` page of `tools`: at most `page_size` of them from the request's cursor
/// on, with the next page's cursor if any are left. A cursor is the index of its page's
/// first tool; a cursor past the end (the list shrank meanwhile) answers an empty last page.
pub fn page_of(
    tools: &[Tool],
    request: Option<PaginatedRequestParams>,
    page_size: usize,
) -> Result<ListToolsResult, ErrorData> {
    let start = match request.and_then(|r| r.cursor) {
        None => 0,
        Some(cursor) => cursor.parse::<usize>().map_err(|_| {
            ErrorData::invalid_params(format!("no page at cursor {cursor:?}"), None)
        })?,
    }
    .min(tools.len());
    let end = tools.len().min(start + page_size.max(1));
    let mut page = ListToolsResult::with_all_items(tools[start..end].to_vec());
    page.next_cursor = (end < tools.len()).then(|| end.to_string());
    Ok(page)
}

/// The MCP server of one session: the service's tools over the service's ledger.
#[derive(Clone)]
pub(crate) struct DemoMcp {
    service: Service,
    tools: Arc<Vec<Tool>>,
}

impl ServerHandler for DemoMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("countersign-demo-tools", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        page_of(&self.tools, request, PAGE_SIZE)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let meta: &JsonObject = &context.meta;
        let text = |key: &str| meta.get(key).and_then(Value::as_str);
        let called = |path| Request {
            path,
            idempotency_key: text(META_IDEMPOTENCY_KEY),
            receipt: text(META_RECEIPT),
        };
        let outcome = match request.name.as_ref() {
            "get_order" => self.service.lookup(&called("mcp:get_order"), &arguments),
            "issue_refund" => {
                let input = &arguments;
                // The receipt signs the arguments, carried beside it in `_meta`.
                let check = move |verifier: Arc<DemoVerifier>| async move {
                    verifier.check_mcp(meta, "issue_refund", input).await
                };
                let called = called("mcp:issue_refund");
                self.service.refund(&called, &arguments, check).await
            }
            other => {
                return Err(ErrorData::invalid_params(format!("no tool {other}"), None));
            }
        };
        Ok(answer(outcome).into())
    }
}

/// An outcome as MCP answers it: the answer as structured content (and as its JSON text);
/// what HTTP answers with a 4xx status as an error result, which MCP has instead.
fn answer(outcome: Outcome) -> CallToolResult {
    match outcome {
        Outcome::Done(answer) => CallToolResult::structured(answer),
        Outcome::NotFound(error) => CallToolResult::error(vec![ContentBlock::text(error)]),
        Outcome::Refused(refusal) => {
            let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
                "receipt refused ({}): {refusal}",
                refusal.code()
            ))]);
            // Where the worker looks for a refusal, as HTTP's `WWW-Authenticate`.
            let code = serde_json::Value::from(refusal.code());
            result.meta = Some(rmcp::model::MetaObject(
                [(META_RECEIPT_REFUSED.to_string(), code)]
                    .into_iter()
                    .collect(),
            ));
            result
        }
    }
}

/// The demo agent's tools as MCP lists them, with what MCP adds: a title and hints.
fn tools() -> Vec<Tool> {
    #[derive(Deserialize)]
    struct AgentFile {
        tools: Vec<AgentTool>,
    }
    #[derive(Deserialize)]
    struct AgentTool {
        name: String,
        description: String,
        input_schema: JsonObject,
    }
    let file: AgentFile = toml::from_str(AGENT_FILE).expect("the demo agent's file parses");
    file.tools
        .into_iter()
        .map(|tool| match tool.name.as_str() {
            "get_order" => Tool::new(tool.name, tool.description, tool.input_schema)
                .with_title("Look up an order")
                .with_annotations(
                    ToolAnnotations::with_title("Look up an order")
                        .read_only(true)
                        .idempotent(true),
                ),
            // Refunding again under the same idempotency key refunds nothing more.
            "issue_refund" => Tool::new(tool.name, tool.description, tool.input_schema)
                .with_annotations(
                    ToolAnnotations::new()
                        .read_only(false)
                        .destructive(true)
                        .idempotent(true),
                ),
            other => panic!("the demo tools service has no tool {other}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(page: &ListToolsResult) -> Vec<&str> {
        page.tools.iter().map(|t| t.name.as_ref()).collect()
    }

    fn at(cursor: &str) -> Option<PaginatedRequestParams> {
        Some(PaginatedRequestParams::default().with_cursor(Some(cursor.into())))
    }

    #[test]
    fn pages_end_without_a_cursor_and_a_cursor_past_the_end_answers_an_empty_page() {
        let tools = tools();
        let first = page_of(&tools, None, 1).unwrap();
        assert_eq!(names(&first), ["get_order"]);
        let second = page_of(&tools, at(first.next_cursor.as_deref().unwrap()), 1).unwrap();
        assert_eq!(names(&second), ["issue_refund"]);
        assert_eq!(second.next_cursor, None);
        assert!(page_of(&tools, at("7"), 1).unwrap().tools.is_empty());
        assert_eq!(names(&page_of(&tools, None, 5).unwrap()).len(), 2);
    }

    #[test]
    fn a_cursor_the_server_never_gave_is_refused() {
        assert!(page_of(&tools(), at("not-a-cursor"), 1).is_err());
    }
}
