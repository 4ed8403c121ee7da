//! Email approvals. Each reviewer of a held call gets an email with one link per action
//! (approve, reject, edit; the run's requester gets only reject unless the policy lets them
//! approve their own request). Each link carries its own random single-use token (see
//! `grant`), and opening it only shows a confirmation page whose form decides (the email door,
//! `crate::doors::email`): mail scanners open every link. Mail leaves through `crate::mail`.

mod deliver;
pub(crate) mod grant;
mod html;
mod message;

pub(crate) use deliver::Email;
