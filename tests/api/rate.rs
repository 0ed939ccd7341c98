//! The mutation rate limit slows clients that may not mutate (so tokens cannot be guessed
//! quickly), not the provisioning hosts the service exists for, unless asked to.

use crate::helpers::{TestApp, assert_problem, spawn_app_with};

const TOKEN: &str = "rate-token-0123456789abcdef";

/// One token a second, bursts of 3.
fn tight(c: &mut keyspread::config::ServeConfig) {
    c.mutation_rate = 1;
    c.mutation_burst = 3;
}

/// Sends `n` allocations of fresh accounts with `authorization`, at once one after the
/// other, and answers their statuses.
async fn allocations(app: &TestApp, authorization: Option<&str>, n: usize) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    for i in 0..n {
        let mut request = app.client.post(app.url(&format!("/keys/acct-{i}")));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        statuses.push(request.send().await.unwrap().status().as_u16());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_allowed_to_mutate_are_not_limited_by_default() {
    let with_token = spawn_app_with(|c| {
        tight(c);
        c.token = Some(TOKEN.parse().unwrap());
    })
    .await;
    let bearer = format!("Bearer {TOKEN}");
    let statuses = allocations(&with_token, Some(&bearer), 10).await;
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");
    // Without a token, a client on the server's host is the one allowed to mutate.
    let local = spawn_app_with(tight).await;
    let statuses = allocations(&local, None, 10).await;
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_valid_credentials_are_still_limited() {
    let app = spawn_app_with(|c| {
        tight(c);
        c.token = Some(TOKEN.parse().unwrap());
    })
    .await;
    let wrong = "Bearer wrong-token-0123456789abcdef";
    for authorization in [Some(wrong), None] {
        let statuses = allocations(&app, authorization, 10).await;
        assert!(
            statuses.iter().all(|s| [401, 429].contains(s)) && statuses.contains(&429),
            "{authorization:?}: {statuses:?}"
        );
    }
    // The guesses took nothing from the holder of the token.
    let bearer = format!("Bearer {TOKEN}");
    assert!(
        allocations(&app, Some(&bearer), 5)
            .await
            .iter()
            .all(|s| *s == 201)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_may_limit_token_holders_too() {
    let app = spawn_app_with(|c| {
        tight(c);
        c.token = Some(TOKEN.parse().unwrap());
        c.limit_token_holders = true;
    })
    .await;
    let bearer = format!("Bearer {TOKEN}");
    let statuses = allocations(&app, Some(&bearer), 10).await;
    assert!(statuses[..3].iter().all(|s| *s == 201), "{statuses:?}");
    let refused = app
        .client
        .post(app.url("/keys/one-more"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert!(statuses.contains(&429), "{statuses:?}");
    assert_problem(
        &crate::helpers::answer(refused).await,
        429,
        "too many changes",
    );
}
