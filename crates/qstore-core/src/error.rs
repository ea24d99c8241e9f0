//! Error types. Configuration errors name the offending setting, its value and what is allowed,
//! so the command line can print them as one line and exit with code 2.

use thiserror::Error;

/// An invalid configuration value.
#[derive(Debug, Clone, Error, PartialEq)]
#[error("invalid {setting} = {value}: {allowed}")]
pub struct ConfigError {
    /// Dotted path of the setting, e.g. `workload.ycsb.theta`.
    pub setting: String,
    /// The value that was given, as text.
    pub value: String,
    /// What would have been accepted, e.g. `must be a finite number >= 0`.
    pub allowed: String,
}

impl ConfigError {
    pub fn new(setting: &str, value: impl ToString, allowed: impl ToString) -> Self {
        ConfigError {
            setting: setting.to_string(),
            value: value.to_string(),
            allowed: allowed.to_string(),
        }
    }
}

/// Errors of qstore operations that are not configuration mistakes.
#[derive(Debug, Error)]
pub enum QError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("unknown procedure {0:?}")]
    UnknownProcedure(String),
    #[error("bad arguments for procedure {proc}: {why}")]
    BadArguments { proc: String, why: String },
    #[error("table {table} is full ({capacity} rows); raise its capacity")]
    TableFull { table: String, capacity: usize },
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Other(String),
    /// The process was asked to stop (SIGINT/SIGTERM) before the work was done.
    #[error("{0}")]
    Interrupted(String),
}
