//! The reviewer's pages in a real browser (headless Chromium, at desktop and phone widths):
//! what a person sees and does, down to the browser's own form checks. Elements are picked by
//! the pages' structure (forms, fields, buttons), not by their wording.

use crate::email::{app_with_email, mail_for};
use countersign_tests::browser::{Browser, Screen};

#[tokio::test]
async fn an_email_link_on_a_phone_fits_the_screen_and_its_form_approves_the_run() {
    let (app, sink) = app_with_email("\"email:alice@example.com\"", None).await;
    let run_id = app.start_run("Refund A-1001.").await;
    app.wait_status(&run_id, "awaiting_approval").await;
    let (_, links) = mail_for(&app, &sink, "alice@example.com").await;
    let browser = Browser::start("email_link_phone", Screen::Phone).await;

    browser.goto(&links[0]).await;
    browser.find("form button[type=submit]").await;
    browser.assert_fits_the_screen().await;
    browser.screenshot("approve-page").await;
    assert_eq!(
        app.get_run_status(&run_id).await,
        "awaiting_approval",
        "opening the link decides nothing"
    );

    browser.click("form button[type=submit]").await;
    browser
        .wait_until(
            "the page that follows the form",
            "return document.readyState === 'complete' && !document.querySelector('form')",
        )
        .await;
    let said = browser.text().await.to_lowercase();
    assert!(
        said.contains("approve"),
        "the page says what was decided: {said}"
    );
    browser.assert_fits_the_screen().await;
    browser.screenshot("recorded-page").await;
    app.wait_status(&run_id, "completed").await;
    assert_eq!(app.tools.refunds().len(), 1);
}
