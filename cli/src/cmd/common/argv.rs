//! Go-style command lines, rewritten for clap before it parses them.
//!
//! The Go controllers' READMEs and the articles type `-kubeconfig=$HOME/.kube/config -v=3
//! -logtostderr`: Go's `flag` package takes a long flag with one dash or two, and klog's `-v`
//! takes a value. clap reads `-kubeconfig` as the short flags `-k -u -b ...`, so
//! [`normalize_args`] rewrites those spellings first:
//!
//! - `-NAME` / `-NAME=VALUE`, where NAME is a long flag of the (sub)command being parsed, gives
//!   `--NAME` / `--NAME=VALUE`; the value of `-NAME VALUE` is passed on untouched.
//! - `-v N` (N digits) gives `--v=N`, klog's verbosity; `-v=N` is the rule above.
//! - `-v` and `-vv` alone stay: they are our verbosity counter.
//!
//! The known names come from clap's own command definition (globals included), so a new flag
//! is covered the day it is added. Anything else, unknown single-dash text included, is left
//! as it is for clap to accept or reject with its usual error; and `--help` is unchanged, since
//! clap still defines every flag with two dashes.

use std::ffi::OsString;

use clap::{Arg, Command};

/// Rewrites Go-style spellings in `args` (with the program name first, as `std::env::args_os`
/// gives it) into clap's; see the module documentation.
pub fn normalize_args<I, T>(command: &Command, args: I) -> Vec<OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut root = command.clone();
    // Building propagates the global flags into every subcommand and fills in each flag's
    // value count, which the lookups below read.
    root.build();
    let mut current = &root;
    let mut args = args.into_iter().map(Into::into);
    let mut out: Vec<OsString> = args.next().into_iter().collect();
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(args);
            break;
        }
        if text == "-v"
            && long_arg(current, "v").is_some()
            && let Some(level) = args.next_if(|next| next.to_str().is_some_and(is_level))
        {
            out.push(format!("--v={}", level.to_string_lossy()).into());
            continue;
        }
        let (rewritten, takes_next) = match text.strip_prefix('-') {
            Some(flag) if !flag.is_empty() => rewrite_flag(current, text, flag),
            _ => {
                // A word: a subcommand's name moves on to that subcommand's flags.
                if let Some(sub) = current.find_subcommand(text) {
                    current = sub;
                }
                (None, false)
            }
        };
        out.push(rewritten.map_or(arg, OsString::from));
        if takes_next && let Some(value) = args.next() {
            out.push(value);
        }
    }
    out
}

/// For a token that starts with `-` (`flag` is the text after that dash): the rewritten token,
/// if any, and whether the next token is this flag's value.
fn rewrite_flag(command: &Command, text: &str, flag: &str) -> (Option<String>, bool) {
    if let Some(long) = flag.strip_prefix('-') {
        // Already `--NAME[=VALUE]`.
        let (name, value) = split_value(long);
        let takes_next =
            value.is_none() && long_arg(command, name).is_some_and(takes_separate_value);
        return (None, takes_next);
    }
    let (name, value) = split_value(flag);
    let one_char = name.chars().count() == 1;
    if !(one_char && value.is_none())
        && let Some(arg) = long_arg(command, name)
    {
        return (
            Some(format!("-{text}")),
            value.is_none() && takes_separate_value(arg),
        );
    }
    // A short flag, a cluster of them, or unknown text: clap's to judge.
    let takes_next = one_char
        && value.is_none()
        && name
            .chars()
            .next()
            .and_then(|c| command.get_arguments().find(|a| a.get_short() == Some(c)))
            .is_some_and(takes_separate_value);
    (None, takes_next)
}

fn split_value(flag: &str) -> (&str, Option<&str>) {
    match flag.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (flag, None),
    }
}

/// The flag of `command` whose long name (or alias) is `name`.
fn long_arg<'a>(command: &'a Command, name: &str) -> Option<&'a Arg> {
    command.get_arguments().find(|arg| {
        arg.get_long() == Some(name)
            || arg
                .get_all_aliases()
                .is_some_and(|aliases| aliases.contains(&name))
    })
}

/// Whether `--flag VALUE` takes VALUE as the flag's (so it must not be rewritten).
fn takes_separate_value(arg: &Arg) -> bool {
    !arg.is_require_equals_set()
        && arg
            .get_num_args()
            .is_some_and(|range| range.min_values() >= 1)
}

fn is_level(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::{Cli, Command as Sub};

    fn normalized(args: &[&str]) -> Vec<String> {
        let mut argv = vec!["kubeloop"];
        argv.extend_from_slice(args);
        normalize_args(&Cli::command(), argv)
            .into_iter()
            .skip(1)
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let mut argv = vec!["kubeloop"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(normalize_args(&Cli::command(), argv))
    }

    #[test]
    fn the_go_readme_command_lines_parse() {
        // sample-controller's README (and seed article 001).
        let cli = parse(&[
            "sample-controller",
            "-kubeconfig=/home/me/.kube/config",
            "-v=3",
            "-logtostderr",
        ])
        .unwrap();
        assert_eq!(cli.log.klog_verbosity, Some(3));
        assert_eq!(cli.log.logtostderr, Some(true));
        let Sub::SampleController(args) = cli.command else {
            panic!("{:?}", cli.command)
        };
        assert_eq!(
            args.cluster.kubeconfig.as_deref(),
            Some(std::path::Path::new("/home/me/.kube/config"))
        );

        // controller101's (seed articles 000, 002, 003).
        let cli = parse(&[
            "vm-controller",
            "--kubeconfig=/home/me/.kube/config",
            "-v=3",
            "--logtostderr",
            "--leader-elect=false",
            "--vm-driver=fake",
            "--lease-lock-namespace=default",
        ])
        .unwrap();
        assert_eq!(cli.log.klog_verbosity, Some(3));
        let Sub::VmController(args) = cli.command else {
            panic!("{:?}", cli.command)
        };
        assert!(!args.leader_elect);
        assert_eq!(args.lease_lock_namespace.as_deref(), Some("default"));
    }

    #[test]
    fn each_accepted_spelling_is_rewritten_to_clap_s() {
        let cases: &[(&[&str], &[&str])] = &[
            (&["-v=3"], &["--v=3"]),
            (&["--v=3"], &["--v=3"]),
            (&["-v", "3"], &["--v=3"]),
            (&["--v", "3"], &["--v", "3"]),
            (&["-v"], &["-v"]),
            (&["-vv"], &["-vv"]),
            (&["-v", "sample-controller"], &["-v", "sample-controller"]),
            (&["-logtostderr"], &["--logtostderr"]),
            (&["--logtostderr"], &["--logtostderr"]),
            (&["-logtostderr=true"], &["--logtostderr=true"]),
            (&["--logtostderr=false"], &["--logtostderr=false"]),
            (
                &["sample-controller", "-kubeconfig=/k"],
                &["sample-controller", "--kubeconfig=/k"],
            ),
            (
                &["sample-controller", "-kubeconfig", "/k"],
                &["sample-controller", "--kubeconfig", "/k"],
            ),
            (
                &["sample-controller", "-master="],
                &["sample-controller", "--master="],
            ),
            (
                &["vm-controller", "-threads", "4", "-leader-elect=false"],
                &["vm-controller", "--threads", "4", "--leader-elect=false"],
            ),
            // An alias is a long name too.
            (
                &["vm-controller", "-health-bind-address=:8081"],
                &["vm-controller", "--health-bind-address=:8081"],
            ),
            (&["-help"], &["--help"]),
        ];
        for (input, want) in cases {
            assert_eq!(&normalized(input), want, "{input:?}");
        }
    }

    #[test]
    fn the_rewritten_spellings_mean_what_they_say() {
        for args in [
            &["-v=4", "sample-controller"][..],
            &["sample-controller", "--v=4"],
            &["sample-controller", "-v", "4"],
            &["sample-controller", "--v", "4"],
        ] {
            let cli = parse(args).unwrap();
            assert_eq!(cli.log.klog_verbosity, Some(4), "{args:?}");
            assert_eq!(cli.log.verbose, 0, "{args:?}");
        }
        let cli = parse(&["sample-controller", "-vv"]).unwrap();
        assert_eq!((cli.log.verbose, cli.log.klog_verbosity), (2, None));
        let cli = parse(&["-v", "sample-controller"]).unwrap();
        assert_eq!((cli.log.verbose, cli.log.klog_verbosity), (1, None));

        // One thread unless asked, the flag before or after the subcommand; never none.
        assert_eq!(parse(&["sample-controller"]).unwrap().runtime_threads, 1);
        let cli = parse(&["sample-controller", "-runtime-threads=2"]).unwrap();
        assert_eq!(cli.runtime_threads, 2);
        let cli = parse(&["--runtime-threads", "4", "vm-controller", "-threads", "3"]).unwrap();
        assert_eq!(cli.runtime_threads, 4);
        assert!(parse(&["sample-controller", "--runtime-threads=0"]).is_err());

        let cli = parse(&["sample-controller", "-logtostderr=false"]).unwrap();
        assert_eq!(cli.log.logtostderr, Some(false));
        // A bool flag does not take the next word, as in Go.
        let cli = parse(&["--logtostderr", "sample-controller"]).unwrap();
        assert_eq!(cli.log.logtostderr, Some(true));

        let cli = parse(&[
            "sample-controller",
            "-kubeconfig",
            "/k",
            "-master=",
            "-resync=1m30s",
        ])
        .unwrap();
        let Sub::SampleController(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.cluster.master.as_deref(), Some(""));
        assert_eq!(args.resync, std::time::Duration::from_secs(90));
    }

    #[test]
    fn values_and_text_after_a_double_dash_are_left_alone() {
        // The value of a flag that takes one is not a flag, whatever it looks like.
        assert_eq!(
            normalized(&["sample-controller", "--namespace", "-master"]),
            ["sample-controller", "--namespace", "-master"]
        );
        assert_eq!(
            normalized(&["sample-controller", "-namespace", "-kubeconfig"]),
            ["sample-controller", "--namespace", "-kubeconfig"]
        );
        assert_eq!(
            normalized(&["sample-controller", "--", "-kubeconfig=/k"]),
            ["sample-controller", "--", "-kubeconfig=/k"]
        );
    }

    #[test]
    fn unknown_single_dash_text_is_left_for_clap_to_reject() {
        for input in [
            &["sample-controller", "-kubecfg=/k"][..],
            &["sample-controller", "-nosuchflag"],
            // A flag of the other subcommand is unknown here.
            &["sample-controller", "-threads=2"],
            &["cluster", "-kubeconfig=/k"],
        ] {
            assert_eq!(normalized(input), input, "{input:?}");
            let err = parse(input).map(|_| ()).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::UnknownArgument,
                "{input:?}: {err}"
            );
        }
        // The same as without the rewrite: clap names the text it did not know.
        let err = parse(&["sample-controller", "-nosuchflag"])
            .map(|_| ())
            .unwrap_err();
        assert!(
            err.to_string().contains("unexpected argument '-n'"),
            "{err}"
        );
    }

    #[test]
    fn help_still_reads_with_two_dashes() {
        let mut command = Cli::command();
        // As clap builds it to print `kubeloop sample-controller --help` (globals included).
        command.build();
        let sample = command
            .find_subcommand_mut("sample-controller")
            .unwrap()
            .render_long_help()
            .to_string();
        for flag in [
            "--kubeconfig <PATH>",
            "--master <URL>",
            "--resync <DURATION>",
            "--v <LEVEL>",
            "--logtostderr[=<BOOL>]",
            "-v, --verbose",
            "--health-probe-bind-address",
        ] {
            assert!(sample.contains(flag), "{flag} in:\n{sample}");
        }
    }
}
