//! Token file parsing and checks, lookup, and the role/queue decisions.

use std::os::unix::fs::PermissionsExt;

use super::*;

const GOOD: &str = r#"
[[tokens]]
name = "producer"
token = "p-0123456789abcdef"
roles = ["produce", "read"]
queues = ["*"]

[[tokens]]
name = "billing-worker"
token = "w-0123456789abcdef"
roles = ["work"]
queues = ["billing"]
"#;

fn known(q: &str) -> bool {
    matches!(q, "billing" | "email")
}

fn grant(tokens: &Tokens, secret: &str) -> Caller {
    Caller::Token(tokens.find(secret.as_bytes()).expect("known token"))
}

#[test]
fn a_good_file_grants_roles_and_queues() {
    let tokens = Tokens::parse(GOOD, known).expect("parses");
    let producer = grant(&tokens, "p-0123456789abcdef");
    let worker = grant(&tokens, "w-0123456789abcdef");
    assert!(producer.allow(Role::Produce, "email").is_ok());
    assert!(producer.allow(Role::Read, "billing").is_ok());
    assert!(producer.every_queue());
    assert!(worker.allow(Role::Work, "billing").is_ok());
    assert!(!worker.every_queue());

    let err = producer.require(Role::Work).expect_err("no work role");
    assert_eq!(err.status, StatusCode::FORBIDDEN);
    assert!(err.message.contains("\"producer\"") && err.message.contains("\"work\""));
    let err = worker.allow(Role::Work, "email").expect_err("other queue");
    assert_eq!(err.status, StatusCode::FORBIDDEN);
    assert!(err.message.contains("queue \"email\""), "{}", err.message);
    assert!(Caller::Open.allow(Role::Work, "anything").is_ok());
}

#[test]
fn unknown_or_truncated_secrets_match_nothing() {
    let tokens = Tokens::parse(GOOD, known).expect("parses");
    assert!(tokens.find(b"p-0123456789abcde").is_none());
    assert!(tokens.find(b"p-0123456789abcdefX").is_none());
    assert!(tokens.find(b"").is_none());
}

#[test]
fn bearer_takes_the_credentials_of_the_bearer_scheme_only() {
    assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
    assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
    assert_eq!(bearer(b"Basic abc"), None);
    assert_eq!(bearer(b"Bearer "), None);
    assert_eq!(bearer(b"Bear"), None);
}

#[test]
fn bad_files_are_refused_with_the_problem_named_and_no_secret() {
    let token = |name: &str, secret: &str, roles: &str, queues: &str| {
        format!(
            "[[tokens]]\nname = \"{name}\"\ntoken = \"{secret}\"\nroles = {roles}\nqueues = {queues}\n"
        )
    };
    let ok = "0123456789abcdef";
    let cases = [
        ("tokens = []".to_string(), "no [[tokens]]"),
        (token("a", "short", r#"["work"]"#, r#"["*"]"#), "16 to 512"),
        (
            token("a", "has space 0123456789", r#"["work"]"#, r#"["*"]"#),
            "visible ASCII",
        ),
        (token("a", ok, "[]", r#"["*"]"#), "roles is empty"),
        (
            token("a", ok, r#"["superuser"]"#, r#"["*"]"#),
            "unknown variant",
        ),
        (token("a", ok, r#"["work"]"#, "[]"), "queues is empty"),
        (
            token("a", ok, r#"["work"]"#, r#"["nope"]"#),
            "queue \"nope\" is not configured",
        ),
        (
            token("", ok, r#"["work"]"#, r#"["*"]"#),
            "name must not be empty",
        ),
        (
            token("a", ok, r#"["work"]"#, r#"["*"]"#)
                + &token("a", "fedcba9876543210", r#"["work"]"#, r#"["*"]"#),
            "name is used twice",
        ),
        (
            token("a", ok, r#"["work"]"#, r#"["*"]"#) + &token("b", ok, r#"["work"]"#, r#"["*"]"#),
            "same secret",
        ),
        ("[[tokens]]\nname = \"a\"\n".to_string(), "missing field"),
        (
            format!("[[tokens]]\nname = \"a\"\ntoken = \"{ok}\nroles = []"),
            "line 3",
        ),
    ];
    for (text, needle) in cases {
        let err = Tokens::parse(&text, known).err().expect(&text);
        assert!(err.contains(needle), "{text}\n=> {err}");
        assert!(!err.contains(ok), "the secret leaked: {err}");
    }
}

#[test]
fn the_file_must_not_be_readable_by_group_or_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, GOOD).expect("write");
    for (mode, ok) in [
        (0o600, true),
        (0o400, true),
        (0o640, false),
        (0o644, false),
        (0o602, false),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let result = Tokens::load(&path, known);
        assert_eq!(result.is_ok(), ok, "mode {mode:o}");
        if let Err(err) = result {
            let msg = err.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("{mode:04o}")), "{msg}");
        }
    }
    let missing = Tokens::load(&dir.path().join("absent"), known)
        .err()
        .expect("missing");
    assert!(matches!(missing, TokenFileError::Io { .. }), "{missing}");
}

#[test]
fn the_admin_role_is_a_console_role_and_grants_nothing_on_the_api() {
    let text = "[[tokens]]\nname = \"ops\"\ntoken = \"0123456789abcdef\"\nroles = [\"admin\"]\nqueues = [\"*\"]\n";
    let tokens = Tokens::parse(text, |_| true).expect("valid");
    let grant = tokens.grant_of(b"0123456789abcdef").expect("found");
    assert!(grant.has(Role::Admin) && grant.every_queue());
    assert!(
        !grant.has(Role::Read),
        "admin does not imply read on the API"
    );
    let caller = Caller::Token(grant);
    for role in [Role::Produce, Role::Work, Role::Read] {
        assert!(caller.require(role).is_err(), "{role:?}");
    }
    assert!(tokens.grant_of(b"0123456789abcdeX").is_none());
    assert!(!tokens.is_open() && Tokens::open().is_open());
}
