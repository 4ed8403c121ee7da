//! What answers a request: a test's function of the whole request, or a script's turns,
//! written out once per wire format so that serving one reads no more of a request than
//! the roles of its messages.

use crate::wire;
use axum::body::Bytes;
use countersign_model::script::Script;
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::sync::Arc;

/// What answers each request (a test's closure or `&Script` converts into one).
pub enum Brain {
    /// Answers each request as a function of all of it.
    Reads(Arc<dyn Fn(&Value) -> Value + Send + Sync>),
    /// Answers with a script's turn.
    Plays(Turns),
}

impl<F: Fn(&Value) -> Value + Send + Sync + 'static> From<F> for Brain {
    fn from(brain: F) -> Self {
        Self::Reads(Arc::new(brain))
    }
}

impl From<&Script> for Brain {
    fn from(script: &Script) -> Self {
        Self::Plays(Turns::of(script))
    }
}

/// The wire formats the fake speaks.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wire {
    /// `POST /v1/messages`
    Anthropic,
    /// `POST /chat/completions`
    OpenAi,
}

/// A script's answers as sent: each turn and then the one for every turn past its end.
pub struct Turns {
    anthropic: Vec<Bytes>,
    openai: Vec<Bytes>,
}

impl Turns {
    fn of(script: &Script) -> Self {
        let turns: Vec<_> = (0..=script.turn_count()).map(|i| script.turn(i)).collect();
        let written = |answer: fn(&[countersign_model::run::Block]) -> Value| {
            turns
                .iter()
                .map(|blocks| Bytes::from(answer(blocks).to_string()))
                .collect()
        };
        Self {
            anthropic: written(wire::anthropic_message),
            openai: written(wire::openai_message),
        }
    }

    /// The answer, as sent in `wire`, to a request asking for turn `index`.
    pub(crate) fn answer(&self, wire: Wire, index: usize) -> Bytes {
        let answers = match wire {
            Wire::Anthropic => &self.anthropic,
            Wire::OpenAi => &self.openai,
        };
        answers[index.min(answers.len() - 1)].clone()
    }
}

/// The turn a request asks for, reading only the roles of its messages.
pub(crate) fn turn_of(body: &[u8]) -> serde_json::Result<usize> {
    #[derive(Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        messages: Vec<Said<'a>>,
    }
    #[derive(Deserialize)]
    struct Said<'a> {
        #[serde(borrow)]
        role: Cow<'a, str>,
    }
    let request: Request = serde_json::from_slice(body)?;
    Ok(request
        .messages
        .iter()
        .filter(|m| m.role == "assistant")
        .count())
}
