//! Aligned, borderless tables: a header row and data rows, columns separated by two spaces, every
//! column but the last padded to its widest cell. Every cell is [`render::escape`]d, so a value
//! from the runtime can never break a row or reach the terminal as an escape sequence.

use std::io::{self, Write};

use crate::cmd::render;

/// A table to print.
#[derive(Debug)]
pub(crate) struct Table {
    headers: Vec<&'static str>,
    show_headers: bool,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub(crate) fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            show_headers: true,
            rows: Vec::new(),
        }
    }

    /// A table of `columns` columns without a header row (`key  value` listings).
    pub(crate) fn headless(columns: usize) -> Self {
        Self {
            headers: vec![""; columns],
            show_headers: false,
            rows: Vec::new(),
        }
    }

    /// Appends a row (one cell per header), each cell [`render::escape`]d.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len(), "one cell per column");
        let cells = cells
            .into_iter()
            .map(|cell| match render::escape(&cell) {
                std::borrow::Cow::Borrowed(_) => cell,
                std::borrow::Cow::Owned(escaped) => escaped,
            })
            .collect();
        self.rows.push(cells);
    }

    /// Writes the table.
    pub(crate) fn write(&self, out: &mut impl Write) -> io::Result<()> {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let headers: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        let header = self.show_headers.then_some(&headers);
        for row in header.into_iter().chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    let pad = width - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }

    /// Prints the table on stdout.
    pub(crate) fn print(&self) -> io::Result<()> {
        self.write(&mut io::stdout().lock())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn columns_align_with_a_two_space_gap() {
        let mut table = Table::new(&["VERSION", "ACTION", "ACTOR"]);
        table.row(vec!["1.0.10".into(), "deploy".into(), "alice".into()]);
        table.row(vec!["1.0.9".into(), "rollback".into(), "bob".into()]);
        let mut out = Vec::new();
        table.write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "VERSION  ACTION    ACTOR\n\
             1.0.10   deploy    alice\n\
             1.0.9    rollback  bob\n"
        );
    }

    #[test]
    fn cells_cannot_break_rows_or_send_escape_sequences() {
        let mut table = Table::new(&["ACTOR", "COMMENT"]);
        table.row(vec![
            "bob\u{1b}[2J".into(),
            "ok\n2025-01-31T09:30:00Z approved by ciso".into(),
        ]);
        let mut out = Vec::new();
        table.write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ACTOR         COMMENT\n\
             bob\\u{1b}[2J  ok\\n2025-01-31T09:30:00Z approved by ciso\n"
        );
    }

    #[test]
    fn an_empty_table_is_its_header() {
        let mut out = Vec::new();
        Table::new(&["ID", "NAME"]).write(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "ID  NAME\n");
    }

    #[test]
    fn headless_tables_align_keys() {
        let mut table = Table::headless(2);
        table.row(vec!["CLI Version".into(), "0.1.0".into()]);
        table.row(vec!["Health".into(), "● SERVING".into()]);
        let mut out = Vec::new();
        table.write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "CLI Version  0.1.0\nHealth       ● SERVING\n"
        );
    }
}
