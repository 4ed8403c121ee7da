//! What answers a request: a test's function of the whole request, or a script's turns,
//! written out once per wire format, whole and streamed, so that serving one reads no more of
//! a request than the roles of its messages and whether it asks for a stream.

use crate::wire::{self, Streamed};
use axum::body::Bytes;
use countersign_model::scripted::Script;
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

impl Wire {
    /// `answer` as this wire streams it, if it is an answer of this wire at all: a test may
    /// answer anything, to see what the worker makes of a broken answer, and that goes as it
    /// is.
    pub(crate) fn stream(self, answer: &Value) -> Option<Streamed> {
        match self {
            Wire::Anthropic => answer["content"]
                .is_array()
                .then(|| wire::anthropic_stream(answer)),
            Wire::OpenAi => answer["choices"]
                .is_array()
                .then(|| wire::openai_stream(answer)),
        }
    }
}

/// A script's answers as sent: each turn and then the one for every turn past its end.
pub struct Turns {
    anthropic: Vec<Written>,
    openai: Vec<Written>,
}

/// One answer as sent to a request for it whole and to one asking for a stream.
pub(crate) struct Written {
    pub(crate) whole: Bytes,
    pub(crate) streamed: Streamed,
}

impl Turns {
    fn of(script: &Script) -> Self {
        let turns: Vec<_> = (0..=script.turn_count()).map(|i| script.turn(i)).collect();
        let written = |wire: Wire, answer: fn(&[countersign_model::run::Block]) -> Value| {
            turns
                .iter()
                .map(|blocks| {
                    let answer = answer(blocks);
                    Written {
                        whole: Bytes::from(answer.to_string()),
                        streamed: wire
                            .stream(&answer)
                            .expect("a script's answer is a message"),
                    }
                })
                .collect()
        };
        Self {
            anthropic: written(Wire::Anthropic, wire::anthropic_message),
            openai: written(Wire::OpenAi, wire::openai_message),
        }
    }

    /// The answer, as sent in `wire`, to a request asking for turn `index`.
    pub(crate) fn answer(&self, wire: Wire, index: usize) -> &Written {
        let answers = match wire {
            Wire::Anthropic => &self.anthropic,
            Wire::OpenAi => &self.openai,
        };
        &answers[index.min(answers.len() - 1)]
    }
}

/// What a request asks for, as far as a script's answer depends on it.
pub(crate) struct Asked {
    /// The turn: how many assistant messages the conversation holds.
    pub(crate) turn: usize,
    pub(crate) stream: bool,
}

/// What a request asks for, reading only the roles of its messages and its `stream`.
pub(crate) fn asked(body: &[u8]) -> serde_json::Result<Asked> {
    #[derive(Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        messages: Vec<Said<'a>>,
        #[serde(default)]
        stream: bool,
    }
    #[derive(Deserialize)]
    struct Said<'a> {
        #[serde(borrow)]
        role: Cow<'a, str>,
    }
    let request: Request = serde_json::from_slice(body)?;
    Ok(Asked {
        turn: request
            .messages
            .iter()
            .filter(|m| m.role == "assistant")
            .count(),
        stream: request.stream,
    })
}
