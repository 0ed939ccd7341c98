//! Ready-to-run `aws kinesis` command lines, every argument quoted for a POSIX shell.
//!
//! Shard ids and stream names are checked when registered, but maps stored before that
//! check may hold anything: quoting keeps a printed command one command whatever it says.

use std::borrow::Cow;

/// `aws kinesis` followed by the `command` words and each option as one word
/// `--flag=value`: a value that starts with `-` (stream names and shard ids may) is then
/// never read as an option.
pub fn kinesis(command: &[&str], options: &[(&str, &str)]) -> String {
    let mut line = String::from("aws kinesis");
    let options = options
        .iter()
        .map(|(flag, value)| format!("{flag}={value}"));
    for word in command.iter().map(|w| w.to_string()).chain(options) {
        line.push(' ');
        line.push_str(&quote(&word));
    }
    line
}

/// `word` as one POSIX shell word: as-is when it holds only characters no shell treats
/// specially, else in single quotes (inside which only `'` itself needs care).
fn quote(word: &str) -> Cow<'_, str> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"_.-+,:/=@%".contains(&b);
    if !word.is_empty() && word.bytes().all(plain) {
        Cow::Borrowed(word)
    } else {
        Cow::Owned(format!("'{}'", word.replace('\'', r"'\''")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What `sh` makes of `line`: its words, each printed with a NUL after it.
    fn sh_words(line: &str) -> Vec<String> {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("set -- {line}\nprintf '%s\\0' \"$@\""))
            .output()
            .expect("sh runs");
        assert!(out.status.success(), "sh refused {line:?}: {out:?}");
        let words = String::from_utf8(out.stdout).expect("utf-8 back");
        words.split_terminator('\0').map(str::to_owned).collect()
    }

    #[test]
    fn plain_words_stay_as_they_are() {
        assert_eq!(
            kinesis(
                &["split-shard"],
                &[("--shard-to-split", "shardId-000000000001")]
            ),
            "aws kinesis split-shard --shard-to-split=shardId-000000000001"
        );
    }

    #[test]
    fn a_value_that_starts_with_a_dash_stays_in_its_option() {
        let line = kinesis(&["wait", "stream-exists"], &[("--stream-name", "-x")]);
        assert_eq!(line, "aws kinesis wait stream-exists --stream-name=-x");
        let line = kinesis(&["merge-shards"], &[("--stream-name", "-x y")]);
        assert_eq!(sh_words(&line)[3], "--stream-name=-x y");
    }

    #[test]
    fn anything_else_is_single_quoted() {
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("$(touch /tmp/x)"), "'$(touch /tmp/x)'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("~x"), "'~x'");
        assert_eq!(quote("*"), "'*'");
    }

    #[test]
    fn a_hostile_id_stays_one_word() {
        let id = "shardId-0$(touch /tmp/x)`id`;rm -rf ~ 'a' \"b\" \n*";
        let line = kinesis(&["split-shard"], &[("--shard-to-split", id)]);
        assert_eq!(
            sh_words(&line),
            [
                "aws",
                "kinesis",
                "split-shard",
                &format!("--shard-to-split={id}")
            ]
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_word_round_trips_through_sh(word in "[^\u{0}]{0,40}", plain in "[a-z0-9-]{1,8}") {
            let line = kinesis(&[&plain], &[("--stream-name", &word)]);
            let option = format!("--stream-name={word}");
            prop_assert_eq!(sh_words(&line), vec!["aws".to_owned(), "kinesis".into(), plain, option]);
        }
    }
}
