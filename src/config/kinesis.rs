//! Where Kinesis is: the flags the Kinesis client takes.

/// Where Kinesis is and who keyspread is to it; the rest comes from the AWS SDK's default
/// chain (environment, profile, container and instance roles).
#[derive(Debug, Clone, Default)]
pub struct KinesisConfig {
    /// `--kinesis-endpoint`: kinesalite or LocalStack instead of AWS.
    pub endpoint: Option<String>,
    /// `--kinesis-region`: the region, instead of the chain's (AWS_REGION, the profile).
    pub region: Option<String>,
}
