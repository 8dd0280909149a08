//! qd on PostgreSQL through the real binary (this binary's name ends in `_postgres`,
//! so the harness runs every `Qd` here on a fresh database of the run's throw-away
//! cluster): the operator's view of the store, and the start-up failures that need
//! no database at all (unreachable, unsafe password file), which never print the
//! password.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Qd, fails, ok, wait_for};

const PASSWORD: &str = "pw-4f1c9b-never-printed";

/// A config for a database behind a socket directory where no server listens, with
/// the password in a file of `mode`.
fn unreachable_config(dir: &Path, mode: u32) -> std::path::PathBuf {
    let secret = dir.join("db-password");
    std::fs::write(&secret, format!("{PASSWORD}\n")).expect("write password");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let config = dir.join("qd.toml");
    let ports: [u16; 2] = common::free_ports();
    let text = format!(
        "[daemon]\ndatabase_url = \"host={sock} user=qd dbname=jobs\"\n\
         database_password_file = \"{secret}\"\ndata_dir = \"{data}\"\n\
         admin_socket = \"{sock}/qctl.sock\"\napi_listen = \"127.0.0.1:{api}\"\n\
         metrics_listen = \"127.0.0.1:{metrics}\"\n\n\
         [queues.demo]\nexecutor = {{ kind = \"external\" }}\n",
        sock = dir.display(),
        secret = secret.display(),
        data = dir.join("data").display(),
        api = ports[0],
        metrics = ports[1],
    );
    std::fs::write(&config, text).expect("write config");
    config
}

fn qd(args: &[&str], config: &Path) -> Output {
    Command::new(common::qd_bin())
        .args(args)
        .arg(config)
        .env("PGPASSWORD", PASSWORD)
        .output()
        .expect("run qd")
}

fn all_output(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn an_unreachable_database_stops_qd_with_one_line_naming_it_and_never_the_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = unreachable_config(dir.path(), 0o600);
    let check = qd(&["check-config"], &config);
    let text = all_output(&check);
    assert!(check.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "store: PostgreSQL database \"jobs\" on {}:5432 as \"qd\"",
            dir.path().display()
        )),
        "{text}"
    );
    let started = std::time::Instant::now();
    let run = qd(&["run", "--config"], &config);
    let text = all_output(&run);
    assert_eq!(run.status.code(), Some(1), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "gave up after {:?}",
        started.elapsed()
    );
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(errors[0].contains("cannot open the store"), "{text}");
    assert!(errors[0].contains("cannot connect"), "{text}");
    assert!(
        errors[0].contains(&dir.path().display().to_string()),
        "{text}"
    );
    assert!(!text.contains(PASSWORD), "{text}");
}

#[test]
fn a_password_file_others_can_read_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = unreachable_config(dir.path(), 0o644);
    for args in [&["check-config"][..], &["run", "--config"][..]] {
        let out = qd(args, &config);
        let text = all_output(&out);
        assert!(!out.status.success(), "{args:?}: {text}");
        assert!(text.contains("daemon.database_password_file"), "{text}");
        assert!(text.contains("db-password has mode 0644"), "{text}");
        assert!(!text.contains(PASSWORD), "{text}");
    }
}

#[test]
fn qctl_names_the_postgres_store_jobs_flow_and_backup_points_to_the_database_tools() {
    let qd = Qd::start("[queues.pull]\nexecutor = { kind = \"external\" }\n");
    let Some(database) = &qd.database else {
        return;
    };
    let status = ok(&qd, &["status"]);
    assert!(
        status.contains(&format!("PostgreSQL database \"{}\"", database.name)),
        "{status}"
    );
    let id = qd.enqueue("pull", "{\"n\": 1}");
    let stored = database.psql(&format!(
        "SELECT state || ' ' || convert_from(p.body, 'UTF8') FROM qd_jobs j \
         JOIN qd_payloads p ON p.job_id = j.id WHERE j.id = '{id}'"
    ));
    assert_eq!(stored, "ready {\"n\": 1}");
    let job = common::lease_one(&qd, "pull", "w1", "5s").expect("a lease");
    let held = database.psql(&format!(
        "SELECT lease_token || ' ' || worker || ' ' || (lease_deadline > now()) \
         FROM qd_jobs WHERE id = '{id}'"
    ));
    assert_eq!(
        held,
        format!("{} w1 true", job["token"]),
        "the lease is in the row"
    );
    common::ack(&qd, &job);
    wait_for("the ack in the database", Duration::from_secs(30), || {
        (database.psql(&format!(
            "SELECT state || ' ' || (lease_token IS NULL) FROM qd_jobs WHERE id = '{id}'"
        )) == "succeeded true")
            .then_some(())
    });
    let backup = qd.dir.path().join("snapshot.db");
    let refused = fails(&qd, &["backup", &backup.display().to_string()], 1);
    assert!(refused.contains("pg_dump"), "{refused}");
    assert!(!backup.exists());
}
