//! `-o json|table`: JSON for scripts (the wire types, as the server sent them), aligned
//! columns for people.

use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

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

/// `expires_at_ms` (the leader's clock) as time left on ours: `12.3s`, or `expired`. Only for
/// reading; the lease's validity is judged by the server.
pub fn expires_in(expires_at_ms: Option<u64>) -> String {
    let Some(at) = expires_at_ms else {
        return "-".into();
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if at <= now {
        "expired".into()
    } else {
        format!("{:.1}s", (at - now) as f64 / 1000.0)
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
}
