//! `-o json|table`: JSON for scripts (the wire types, as the server sent them), aligned
//! columns for people.

use std::io::IsTerminal;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The API's JSON bodies (one compact object per line for `lock watch`).
    Json,
    /// Aligned columns.
    Table,
}

/// Table on a terminal, JSON in a pipe or file, unless `-o` says otherwise.
pub fn resolve(choice: Option<Format>) -> Format {
    choice.unwrap_or(if std::io::stdout().is_terminal() {
        Format::Table
    } else {
        Format::Json
    })
}

pub fn json_pretty(value: &impl Serialize) {
    print_json(serde_json::to_string_pretty(value));
}

/// One compact object per line, for streams (`lock watch`).
pub fn json_line(value: &impl Serialize) {
    print_json(serde_json::to_string(value));
}

fn print_json(text: serde_json::Result<String>) {
    // The wire types always serialize (no maps with non-string keys); say so if that changes.
    match text {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("error: internal: cannot print the answer as JSON: {e}"),
    }
}

/// Columns padded to their widest cell, two spaces apart.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    pub fn row(&mut self, cells: Vec<String>) -> &mut Self {
        self.rows.push(cells);
        self
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// An optional cell: `-` when absent.
pub fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// Time left of a lease by the server's own log time: `expires_at_ms − now_ms`, both stamped
/// by the leader, as `12.3s`, or `expired`. Never against the local wall clock: after an outage
/// the log time can lag it by minutes, and a live lease would show as expired. Without the
/// server's `now_ms` (0, an older node) only the absolute expiry is shown. For reading only;
/// the lease's validity is judged by the server.
pub fn expires_in(expires_at_ms: Option<u64>, now_ms: Option<u64>) -> String {
    let Some(at) = expires_at_ms else {
        return "-".into();
    };
    match now_ms.filter(|&n| n > 0) {
        None => format!("at {at} ms (log time)"),
        Some(now) if at <= now => "expired".into(),
        Some(now) => format!("{:.1}s", (at - now) as f64 / 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_to_the_widest_cell() {
        let mut t = Table::new(&["ID", "ADDR"]);
        t.row(vec!["1".into(), "127.0.0.1:7001".into()]);
        t.row(vec!["12".into(), "-".into()]);
        assert_eq!(t.render(), "ID  ADDR\n1   127.0.0.1:7001\n12  -\n");
    }

    #[test]
    fn time_left_is_counted_on_the_server_clock_not_ours() {
        // The leader's log time lags this machine's wall clock by ten minutes (an outage):
        // the lease still has 5 s on the server's clock.
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64;
        let server_now = wall - 600_000;
        assert_eq!(
            expires_in(Some(server_now + 5_000), Some(server_now)),
            "5.0s"
        );
        assert_eq!(expires_in(Some(server_now), Some(server_now)), "expired");
        assert_eq!(expires_in(None, Some(server_now)), "-");
        assert_eq!(expires_in(Some(42), None), "at 42 ms (log time)");
        assert_eq!(expires_in(Some(42), Some(0)), "at 42 ms (log time)");
    }
}
