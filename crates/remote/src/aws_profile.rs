//! The AWS shared files: `~/.aws/credentials` and `~/.aws/config` (or the
//! files `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE` name), read
//! for the profile `AWS_PROFILE` names (`default` without it) — where the
//! AWS CLI and SDKs find keys, region and endpoint when the environment
//! does not set them. object_store reads the environment only, so a user
//! whose `aws s3 ls` works would otherwise be refused here.
//!
//! The format (the AWS CLI's "Configuration and credential file
//! settings"): INI sections; the credentials file names a profile `[NAME]`,
//! the config file `[profile NAME]` (and `[default]`); `key = value` lines;
//! `#` and `;` start comments. Keys read: `aws_access_key_id`,
//! `aws_secret_access_key`, `aws_session_token`, `region`,
//! `endpoint_url`; the credentials file wins over the config file for a
//! key both set, and the environment wins over both (the caller applies it
//! after these).

use std::path::PathBuf;

/// The settings of the active profile as object_store S3 config keys
/// (`aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`,
/// `aws_region`, `aws_endpoint`), config file first, credentials after.
pub(crate) fn profile_settings() -> Vec<(String, String)> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = |var: &str, name: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
    };
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_string());
    let read = |p: Option<PathBuf>| p.and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
    let mut out = section(&read(file("AWS_CONFIG_FILE", "config")), &profile, true);
    out.extend(section(
        &read(file("AWS_SHARED_CREDENTIALS_FILE", "credentials")),
        &profile,
        false,
    ));
    out
}

/// The keys of `profile` in the INI `text`; `config_file`: sections are
/// `[profile NAME]` (except `[default]`).
fn section(text: &str, profile: &str, config_file: bool) -> Vec<(String, String)> {
    let wanted = if config_file && profile != "default" {
        format!("profile {profile}")
    } else {
        profile.to_string()
    };
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.split_whitespace().collect::<Vec<_>>().join(" ") == wanted;
            continue;
        }
        if !inside {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else { continue };
        let key = match k.trim() {
            "aws_access_key_id" => "aws_access_key_id",
            "aws_secret_access_key" => "aws_secret_access_key",
            "aws_session_token" => "aws_session_token",
            "region" => "aws_region",
            "endpoint_url" => "aws_endpoint",
            _ => continue,
        };
        out.push((key.to_string(), v.trim().to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "\
[default]
region = eu-west-1

# a comment
[profile lab]
region = us-east-1
endpoint_url = http://127.0.0.1:9000
output = json
";
    const CREDENTIALS: &str = "\
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secret-default

[lab]
aws_access_key_id=AKIDLAB
aws_secret_access_key=secret lab
; aws_session_token = not-this
";

    #[test]
    fn the_named_profile_of_each_file_is_read() {
        let lab: Vec<_> = section(CONFIG, "lab", true)
            .into_iter()
            .chain(section(CREDENTIALS, "lab", false))
            .collect();
        let get = |k: &str| lab.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("aws_region"), Some("us-east-1"));
        assert_eq!(get("aws_endpoint"), Some("http://127.0.0.1:9000"));
        assert_eq!(get("aws_access_key_id"), Some("AKIDLAB"));
        assert_eq!(get("aws_secret_access_key"), Some("secret lab"));
        assert_eq!(get("aws_session_token"), None);
        let default = section(CONFIG, "default", true);
        assert_eq!(default, vec![("aws_region".to_string(), "eu-west-1".to_string())]);
        assert!(section(CONFIG, "missing", true).is_empty());
        // The config file's `[lab]` (without "profile") is not the profile.
        assert!(section("[lab]\nregion = x\n", "lab", true).is_empty());
    }
}
