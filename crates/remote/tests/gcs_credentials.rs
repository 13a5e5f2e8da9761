//! Which application-default credentials file a `gs://` URL's client
//! reads: `GOOGLE_APPLICATION_CREDENTIALS`, else the one in gcloud's
//! configuration directory `$CLOUDSDK_CONFIG`, else
//! `~/.config/gcloud/application_default_credentials.json`.
//!
//! No request is sent: each file holds a credential type object_store
//! cannot use (a different one per file), so the client is refused while
//! it is set up, and the message says which type it read. One test in its
//! own binary, because it sets process-wide variables.

use std::path::Path;

use ext4kit_remote::{open_url, RemoteOptions};

fn adc(dir: &Path, kind: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let f = dir.join("application_default_credentials.json");
    std::fs::write(&f, format!("{{\"type\": \"{kind}\"}}")).unwrap();
    f
}

/// The open's error text (it must fail while setting up the client).
fn refusal() -> String {
    let e = open_url("gs://ext4kit-test-bucket/disk.img", &RemoteOptions::default())
        .expect_err("credentials of an unusable type were accepted");
    e.to_string()
}

#[test]
fn the_gcloud_credentials_files_are_read_in_order() {
    let root = std::env::temp_dir().join(format!("ext4kit-gcs-adc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (k, _) in std::env::vars() {
        if k.starts_with("GOOGLE_") || k == "SERVICE_ACCOUNT" || k == "CLOUDSDK_CONFIG" {
            std::env::remove_var(k);
        }
    }
    let home = root.join("home");
    std::env::set_var("HOME", &home);
    // gcloud's default place, under HOME.
    adc(&home.join(".config/gcloud"), "impersonated_service_account");
    let msg = refusal();
    assert!(msg.contains("impersonated_service_account"), "{msg}");
    // A moved configuration directory wins over it.
    let moved = root.join("gcloud-config");
    adc(&moved, "external_account");
    std::env::set_var("CLOUDSDK_CONFIG", &moved);
    let msg = refusal();
    assert!(msg.contains("external_account"), "{msg}");
    // GOOGLE_APPLICATION_CREDENTIALS wins over both.
    let named = adc(&root.join("named"), "gdch_service_account");
    std::env::set_var("GOOGLE_APPLICATION_CREDENTIALS", &named);
    let msg = refusal();
    assert!(msg.contains("gdch_service_account"), "{msg}");
    eprintln!("{msg}");
    let _ = std::fs::remove_dir_all(&root);
}
