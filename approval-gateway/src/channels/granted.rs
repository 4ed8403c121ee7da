//! A call decided under a standing grant, as the channels tell of it. Nobody was asked, so
//! no channel showed the call, and its decided event names only the grant: what the call was
//! is read as the inbox reads it (from the run, or once the run moved on, from the `requested`
//! entry of its audit trail), and who made the grant from the grant.

use crate::channels::delivery::DeliveryError;
use crate::pages::request_view::CallView;
use crate::state::AppState;
use countersign_model::run::RunId;

pub(crate) struct Granted {
    /// The grant's id, `grt_…`.
    pub(crate) id: String,
    /// Who made the grant, sorted; none once the grant is no longer kept.
    pub(crate) makers: Vec<String>,
    /// The call's summary, as reviewers would have been shown it.
    pub(crate) summary: String,
}

impl Granted {
    /// The call `call_id` of `run_id`, decided under grant `id`.
    pub(crate) async fn load(
        state: &AppState,
        run_id: &RunId,
        call_id: &str,
        id: &str,
    ) -> Result<Self, DeliveryError> {
        let view = CallView::load(state, run_id.as_str(), call_id)
            .await
            .map_err(|e| DeliveryError::Retry(e.message))?
            .ok_or_else(|| DeliveryError::GiveUp(format!("run {run_id} has no call {call_id}")))?;
        let makers = state
            .store
            .grant(id)
            .await?
            .map(|g| g.granted_by)
            .unwrap_or_default();
        Ok(Self {
            id: id.to_string(),
            makers,
            summary: view.summary,
        })
    }

    /// `Approved under grant grt_… (made by alice)`, in plain text.
    pub(crate) fn headline(&self) -> String {
        match self.makers.as_slice() {
            [] => format!("Approved under grant {}", self.id),
            makers => format!(
                "Approved under grant {} (made by {})",
                self.id,
                makers.join(", ")
            ),
        }
    }
}
