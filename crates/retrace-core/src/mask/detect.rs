//! The built-in detectors that `pattern` rules name.
use serde::{Deserialize, Serialize};

/// A built-in secret detector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Detector {
    /// A PEM private key block, `-----BEGIN … PRIVATE KEY-----` to `-----END … PRIVATE KEY-----`.
    PrivateKey,
    /// A JSON Web Token: three base64url parts, the first starting `eyJ`.
    Jwt,
    /// OpenAI keys: `sk-…`, `sk-proj-…`.
    OpenaiKey,
    /// Anthropic keys: `sk-ant-…`.
    AnthropicKey,
    /// AWS access key ids: `AKIA…`, `ASIA…` (20 characters).
    AwsAccessKey,
    /// GitHub tokens: `ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`, `github_pat_`.
    GithubToken,
    /// Google API keys: `AIza…` (39 characters).
    GoogleApiKey,
    /// Slack tokens: `xoxa-`, `xoxb-`, `xoxp-`, `xoxr-`, `xoxs-`.
    SlackToken,
    /// Stripe live keys: `sk_live_…`, `rk_live_…`.
    StripeKey,
    /// The credential after `Bearer ` or `BEARER ` (at least 12 characters, one a digit).
    Bearer,
    /// An email address.
    Email,
    /// A payment card number: 13–19 digits starting 2–6, optionally grouped by spaces or dashes,
    /// only when the Luhn check passes.
    Card,
    /// An IBAN: country code, check digits, BBAN, optionally grouped by fours, only when the
    /// mod-97 check passes.
    Iban,
}

impl Detector {
    /// Every detector, in the order [`super::MaskRules::defaults`] lists them.
    pub const ALL: &'static [Detector] = &[
        Detector::PrivateKey,
        Detector::Jwt,
        Detector::OpenaiKey,
        Detector::AnthropicKey,
        Detector::AwsAccessKey,
        Detector::GithubToken,
        Detector::GoogleApiKey,
        Detector::SlackToken,
        Detector::StripeKey,
        Detector::Bearer,
        Detector::Email,
        Detector::Card,
        Detector::Iban,
    ];

    /// The detector's name in rules and `retrace.toml`.
    pub fn name(self) -> &'static str {
        match self {
            Detector::PrivateKey => "private_key",
            Detector::Jwt => "jwt",
            Detector::OpenaiKey => "openai_key",
            Detector::AnthropicKey => "anthropic_key",
            Detector::AwsAccessKey => "aws_access_key",
            Detector::GithubToken => "github_token",
            Detector::GoogleApiKey => "google_api_key",
            Detector::SlackToken => "slack_token",
            Detector::StripeKey => "stripe_key",
            Detector::Bearer => "bearer",
            Detector::Email => "email",
            Detector::Card => "card",
            Detector::Iban => "iban",
        }
    }

    /// The detector named `name`.
    pub fn from_name(name: &str) -> Option<Detector> {
        Detector::ALL.iter().copied().find(|d| d.name() == name)
    }

    /// The token kind its default rule produces.
    pub fn kind(self) -> &'static str {
        match self {
            Detector::PrivateKey => "privkey",
            Detector::Jwt => "jwt",
            Detector::OpenaiKey
            | Detector::AnthropicKey
            | Detector::AwsAccessKey
            | Detector::GithubToken
            | Detector::GoogleApiKey
            | Detector::SlackToken
            | Detector::StripeKey => "apikey",
            Detector::Bearer => "bearer",
            Detector::Email => "email",
            Detector::Card => "card",
            Detector::Iban => "iban",
        }
    }
}
