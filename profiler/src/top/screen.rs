//! Draws [`TopState`] on the terminal with ratatui: a header naming what is shown, the sample
//! accounting, the table with its trends, the opened function's callers and callees, and the
//! keys.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Modifier, Style, Stylize},
    text::{Line, Span},
    widgets::{Block, Borders, Cell, Paragraph, Row as TableRow, Table, TableState},
    Frame,
};

use super::state::{Neighbour, Row, Table as Shown, TopState};

/// Eighths of a cell, lowest first: a trend's bars.
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// What the header says besides the state: the target and how long top has run.
pub struct Heading<'a> {
    pub target: &'a str,
    pub elapsed_s: u64,
    pub waiting: bool,
}

pub fn draw(frame: &mut Frame, state: &TopState, heading: &Heading) {
    let neighbours = state.neighbours();
    let [header, accounting, table, opened, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(if neighbours.is_some() { 8 } else { 0 }),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(header_line(state, heading)), header);
    frame.render_widget(
        Paragraph::new(accounting_line(state, heading)).fg(ratatui::style::Color::Yellow),
        accounting,
    );
    draw_table(frame, state, table);
    if let Some((name, callers, callees)) = neighbours {
        let [left, right] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
                .areas(opened);
        draw_neighbours(frame, left, &format!("callers of {name}"), &callers);
        draw_neighbours(frame, right, &format!("callees of {name}"), &callees);
    }
    frame.render_widget(Paragraph::new(key_line(state)).reversed(), keys);
}

fn header_line(state: &TopState, heading: &Heading) -> Line<'static> {
    let events = state.events();
    let event = events.get(state.event).copied().unwrap_or("-");
    let elapsed = heading.elapsed_s;
    Line::from(vec![
        Span::from(format!("top {}  ", heading.target)).bold(),
        Span::from(format!(
            "event {event} {}/{}  by {}  sort {}  {:02}:{:02}:{:02}",
            state.event + 1,
            events.len().max(1),
            state.table.name(),
            state.order.name(),
            elapsed / 3600,
            elapsed / 60 % 60,
            elapsed % 60
        )),
    ])
}

fn accounting_line(state: &TopState, heading: &Heading) -> String {
    if heading.waiting {
        return "waiting for the first window...".to_string();
    }
    let accounting = state.accounting();
    let lost_percent = if accounting.fired == 0 {
        0.0
    } else {
        100.0 * accounting.lost as f64 / accounting.fired as f64
    };
    let kept = if state.unit() == "nanoseconds" {
        format!(
            "{:.3} s blocked in {} blocks",
            accounting.kept as f64 / 1e9,
            accounting.fired
        )
    } else {
        format!(
            "{} samples kept, {} fired",
            accounting.kept, accounting.fired
        )
    };
    let mut line = format!(
        "last {:.0} s: {kept}, {} lost ({lost_percent:.2}%)",
        accounting.seconds, accounting.lost
    );
    if let Some((cause, count)) = accounting.causes.first() {
        line.push_str(&format!("; {cause}: {count}"));
    }
    if accounting.dropped_windows > 0 {
        line.push_str(&format!(
            "; {} windows not shown (screen behind)",
            accounting.dropped_windows
        ));
    }
    line
}

fn key_line(state: &TopState) -> String {
    if state.typing {
        return format!("filter: {}_   (Enter: keep  Esc: clear)", state.filter);
    }
    // The filter first: a narrow terminal cuts the end of the line.
    let filter = if state.filter.is_empty() {
        String::new()
    } else {
        format!("filter: {}  ", state.filter)
    };
    format!("{filter}q quit  / filter  s sort  e event  v view  ↑↓ move  Enter callers/callees")
}

/// A trend as bars, the last `width` windows, scaled to the highest.
fn trend(values: &[f64], width: usize) -> String {
    let shown = &values[values.len().saturating_sub(width)..];
    let highest = shown.iter().copied().fold(0.0, f64::max);
    shown
        .iter()
        .map(|value| {
            if highest <= 0.0 || *value <= 0.0 {
                ' '
            } else {
                // In eighths of the highest, rounded up: any share shows.
                BARS[((value / highest) * 8.0).ceil().clamp(1.0, 8.0) as usize - 1]
            }
        })
        .collect()
}

fn draw_table(frame: &mut Frame, state: &TopState, area: Rect) {
    let rows = state.rows();
    let functions = state.table == Shown::Functions;
    let trend_width = if area.width >= 120 { 30 } else { 10 };
    let count_title = if state.unit() == "nanoseconds" {
        "ms"
    } else {
        "samples"
    };
    let count = |row: &Row| {
        if state.unit() == "nanoseconds" {
            format!("{:.1}", row.count as f64 / 1e6)
        } else {
            row.count.to_string()
        }
    };
    let body = rows.iter().map(|row| {
        let mut cells = vec![Cell::from(format!("{:5.1}", row.self_share))];
        if functions {
            cells.push(Cell::from(format!(
                "{:5.1}",
                row.total_share.unwrap_or_default()
            )));
        }
        cells.push(Cell::from(count(row)));
        cells.push(Cell::from(trend(&row.trend, trend_width)).cyan());
        cells.push(Cell::from(row.name.clone()));
        if functions {
            cells.push(Cell::from(row.module.clone()).dim());
        }
        TableRow::new(cells)
    });
    let name = match state.table {
        Shown::Functions => "function",
        Shown::Processes => "process",
        Shown::Containers => "container",
    };
    let (header, widths): (Vec<&str>, Vec<Constraint>) = if functions {
        (
            vec!["self%", "total%", count_title, "trend", name, "module"],
            vec![
                Constraint::Length(6),
                Constraint::Length(6),
                Constraint::Length(8),
                Constraint::Length(trend_width as u16),
                Constraint::Fill(3),
                Constraint::Fill(1),
            ],
        )
    } else {
        (
            vec!["share%", count_title, "trend", name],
            vec![
                Constraint::Length(6),
                Constraint::Length(8),
                Constraint::Length(trend_width as u16),
                Constraint::Fill(1),
            ],
        )
    };
    let table = Table::new(body, widths)
        .header(TableRow::new(header).bold().underlined())
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut selection = TableState::default().with_selected(Some(state.selected));
    frame.render_stateful_widget(table, area, &mut selection);
}

fn draw_neighbours(frame: &mut Frame, area: Rect, title: &str, neighbours: &[Neighbour]) {
    let rows = neighbours.iter().map(|neighbour| {
        TableRow::new(vec![
            Cell::from(format!("{:5.1}", neighbour.share)),
            Cell::from(neighbour.name.clone()),
        ])
    });
    let table = Table::new(rows, [Constraint::Length(6), Constraint::Fill(1)])
        .block(Block::new().borders(Borders::TOP).title(title.to_string()));
    frame.render_widget(table, area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trends_scale_to_their_highest_and_keep_the_last_windows() {
        assert_eq!(trend(&[0.0, 25.0, 50.0], 10), " ▄█");
        assert_eq!(trend(&[50.0, 10.0, 20.0], 2), "▄█");
        assert_eq!(trend(&[0.1, 100.0], 2), "▁█");
        assert_eq!(trend(&[], 10), "");
    }
}
