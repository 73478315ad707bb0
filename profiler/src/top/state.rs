//! What `profiler top` shows and how keys change it: the last minute of windows, the event,
//! table, order and filter chosen, the selected row and whether its callers and callees are
//! open. Pure: the screen draws it, the tests drive it with keys.

use std::collections::VecDeque;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::summary::{EventWindow, FunctionCounts, WindowSummary};
use crate::{aggregate::functions::FunctionName, fast_hash::HashMap};

/// Windows kept: the trends' length.
pub const HISTORY: usize = 60;
/// Windows the rows add up: shares over the last few seconds, steady enough to read.
pub const SPAN: usize = 5;
/// Among an opened function's callees: its own samples.
pub const SELF_ROW: &str = "(self)";
/// Callers and callees shown for an opened function, each.
const NEIGHBOURS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Functions,
    Processes,
    Containers,
}

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::Functions => "functions",
            Table::Processes => "processes",
            Table::Containers => "containers",
        }
    }

    fn next(self) -> Table {
        match self {
            Table::Functions => Table::Processes,
            Table::Processes => Table::Containers,
            Table::Containers => Table::Functions,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Highest self share first (a process's or container's share: its samples).
    SelfShare,
    /// Highest total share first (functions; others by their share).
    TotalShare,
    Name,
}

impl Order {
    pub fn name(self) -> &'static str {
        match self {
            Order::SelfShare => "self",
            Order::TotalShare => "total",
            Order::Name => "name",
        }
    }

    fn next(self) -> Order {
        match self {
            Order::SelfShare => Order::TotalShare,
            Order::TotalShare => Order::Name,
            Order::Name => Order::SelfShare,
        }
    }
}

/// One row of the table, over the last [`SPAN`] windows.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub name: String,
    /// The function's module; empty for processes and containers.
    pub module: String,
    /// Of the event's samples (or time, off-CPU) in the span, in percent.
    pub self_share: f64,
    /// Functions only: with the function anywhere on the stack.
    pub total_share: Option<f64>,
    pub count: u64,
    /// The self share in each of the last windows, oldest first.
    pub trend: Vec<f64>,
    function: Option<FunctionName>,
}

/// A caller or callee of the opened function and its share of the event.
#[derive(Clone, Debug, PartialEq)]
pub struct Neighbour {
    pub name: String,
    pub share: f64,
}

/// The sample accounting of the span, for the event shown.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Accounting {
    pub seconds: f64,
    pub kept: u64,
    pub fired: u64,
    /// Samples lost in the span, all events.
    pub lost: u64,
    /// Causes of losses in the span (stacks cut short, maps full), most first, all events.
    pub causes: Vec<(String, u64)>,
    /// Windows the screen could not keep up with.
    pub dropped_windows: u64,
}

/// What a key asks of the loop around the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Redraw,
    Quit,
}

pub struct TopState {
    history: VecDeque<WindowSummary>,
    pub event: usize,
    pub table: Table,
    pub order: Order,
    pub filter: String,
    /// Keys go to the filter.
    pub typing: bool,
    pub selected: usize,
    /// The function whose callers and callees are open.
    pub opened: Option<FunctionName>,
    pub dropped_windows: u64,
}

impl Default for TopState {
    fn default() -> TopState {
        TopState {
            history: VecDeque::new(),
            event: 0,
            table: Table::Functions,
            order: Order::SelfShare,
            filter: String::new(),
            typing: false,
            selected: 0,
            opened: None,
            dropped_windows: 0,
        }
    }
}

impl TopState {
    pub fn push(&mut self, window: WindowSummary) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(window);
        self.event = self.event.min(self.events().len().saturating_sub(1));
    }

    /// The events' names, as the latest window has them.
    pub fn events(&self) -> Vec<&str> {
        self.history.back().map_or_else(Vec::new, |window| {
            window
                .events
                .iter()
                .map(|event| event.name.as_str())
                .collect()
        })
    }

    /// The unit of the event shown: `samples`, or `nanoseconds` off-CPU.
    pub fn unit(&self) -> &str {
        self.history
            .back()
            .and_then(|window| window.events.get(self.event))
            .map_or("samples", |event| event.unit.as_str())
    }

    /// The event shown, window by window, oldest first (a window without it is empty).
    fn event_windows(&self) -> impl DoubleEndedIterator<Item = Option<&EventWindow>> {
        self.history
            .iter()
            .map(move |window| window.events.get(self.event))
    }

    fn span(&self) -> impl Iterator<Item = &EventWindow> {
        self.event_windows().rev().take(SPAN).flatten()
    }

    pub fn accounting(&self) -> Accounting {
        let windows: Vec<&WindowSummary> = self.history.iter().rev().take(SPAN).collect();
        let mut causes: HashMap<&str, u64> = HashMap::default();
        for window in &windows {
            for (cause, count) in &window.losses {
                *causes.entry(cause).or_default() += count;
            }
        }
        let mut causes: Vec<(String, u64)> = causes
            .into_iter()
            .map(|(cause, count)| (cause.to_string(), count))
            .collect();
        causes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Accounting {
            seconds: windows.iter().map(|window| window.seconds).sum(),
            kept: self.span().map(|event| event.kept).sum(),
            fired: self.span().map(|event| event.fired).sum(),
            lost: windows.iter().map(|window| window.samples_lost()).sum(),
            causes,
            dropped_windows: self.dropped_windows,
        }
    }

    /// The table's rows: filtered, in order.
    pub fn rows(&self) -> Vec<Row> {
        let kept: u64 = self.span().map(|event| event.kept).sum();
        let share = |count: u64| {
            if kept == 0 {
                0.0
            } else {
                100.0 * count as f64 / kept as f64
            }
        };
        let trend_of = |count_in: &dyn Fn(&EventWindow) -> u64| -> Vec<f64> {
            self.event_windows()
                .map(|event| match event {
                    Some(event) if event.kept > 0 => {
                        100.0 * count_in(event) as f64 / event.kept as f64
                    }
                    _ => 0.0,
                })
                .collect()
        };
        let filter = self.filter.to_lowercase();
        let wanted = |name: &str| filter.is_empty() || name.to_lowercase().contains(&filter);
        let mut rows: Vec<Row> = match self.table {
            Table::Functions => {
                let mut sums: HashMap<&FunctionName, FunctionCounts> = HashMap::default();
                for event in self.span() {
                    for (function, counts) in &event.functions {
                        let sum = sums.entry(function).or_default();
                        sum.self_count += counts.self_count;
                        sum.total_count += counts.total_count;
                    }
                }
                sums.into_iter()
                    .filter(|(function, _)| wanted(&function.name))
                    .map(|(function, counts)| Row {
                        name: function.name.clone(),
                        module: function.module.clone(),
                        self_share: share(counts.self_count),
                        total_share: Some(share(counts.total_count)),
                        count: counts.self_count,
                        trend: trend_of(&|event| {
                            event
                                .functions
                                .get(function)
                                .map_or(0, |counts| counts.self_count)
                        }),
                        function: Some(function.clone()),
                    })
                    .collect()
            }
            Table::Processes | Table::Containers => {
                let processes = self.table == Table::Processes;
                fn groups(event: &EventWindow, processes: bool) -> &HashMap<String, u64> {
                    if processes {
                        &event.processes
                    } else {
                        &event.containers
                    }
                }
                let mut sums: HashMap<&str, u64> = HashMap::default();
                for event in self.span() {
                    for (name, count) in groups(event, processes) {
                        *sums.entry(name).or_default() += count;
                    }
                }
                sums.into_iter()
                    .filter(|(name, _)| wanted(name))
                    .map(|(name, count)| Row {
                        name: name.to_string(),
                        module: String::new(),
                        self_share: share(count),
                        total_share: None,
                        count,
                        trend: trend_of(&|event| {
                            groups(event, processes).get(name).copied().unwrap_or(0)
                        }),
                        function: None,
                    })
                    .collect()
            }
        };
        let by_name = |a: &Row, b: &Row| a.name.cmp(&b.name).then_with(|| a.module.cmp(&b.module));
        match self.order {
            Order::SelfShare => {
                rows.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| by_name(a, b)))
            }
            Order::TotalShare => rows.sort_by(|a, b| {
                b.total_share
                    .unwrap_or(b.self_share)
                    .total_cmp(&a.total_share.unwrap_or(a.self_share))
                    .then_with(|| by_name(a, b))
            }),
            Order::Name => rows.sort_by(by_name),
        }
        rows
    }

    /// The opened function's callers and callees over the span, most first.
    pub fn neighbours(&self) -> Option<(String, Vec<Neighbour>, Vec<Neighbour>)> {
        let function = self.opened.as_ref()?;
        let kept: u64 = self.span().map(|event| event.kept).sum();
        let mut callers: HashMap<&str, u64> = HashMap::default();
        let mut callees: HashMap<&str, u64> = HashMap::default();
        // Its own samples among its callees, as `report --callees` lists them.
        let own: u64 = self
            .span()
            .filter_map(|event| event.functions.get(function))
            .map(|counts| counts.self_count)
            .sum();
        if own > 0 {
            callees.insert(SELF_ROW, own);
        }
        for event in self.span() {
            for ((caller, callee), count) in &event.calls {
                if callee == function {
                    *callers.entry(&caller.name).or_default() += count;
                }
                if caller == function {
                    *callees.entry(&callee.name).or_default() += count;
                }
            }
        }
        let listed = |counts: HashMap<&str, u64>| {
            let mut list: Vec<Neighbour> = counts
                .into_iter()
                .map(|(name, count)| Neighbour {
                    name: name.to_string(),
                    share: if kept == 0 {
                        0.0
                    } else {
                        100.0 * count as f64 / kept as f64
                    },
                })
                .collect();
            list.sort_by(|a, b| {
                b.share
                    .total_cmp(&a.share)
                    .then_with(|| a.name.cmp(&b.name))
            });
            list.truncate(NEIGHBOURS);
            list
        };
        Some((function.name.clone(), listed(callers), listed(callees)))
    }

    /// What `key` does: typing into the filter, or a command.
    pub fn key(&mut self, key: KeyEvent) -> Action {
        if key.modifiers.contains(KeyModifiers::CONTROL)
            && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('d'))
        {
            return Action::Quit;
        }
        if self.typing {
            match key.code {
                KeyCode::Char(c) => self.filter.push(c),
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Enter => self.typing = false,
                KeyCode::Esc => {
                    self.filter.clear();
                    self.typing = false;
                }
                _ => {}
            }
            self.selected = 0;
            return Action::Redraw;
        }
        let rows = self.rows().len();
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('/') => self.typing = true,
            KeyCode::Char('s') => self.order = self.order.next(),
            KeyCode::Char('e') | KeyCode::Tab => {
                let events = self.events().len().max(1);
                self.event = (self.event + 1) % events;
                self.selected = 0;
                self.opened = None;
            }
            KeyCode::Char('v') => {
                self.table = self.table.next();
                self.selected = 0;
                self.opened = None;
            }
            KeyCode::Down | KeyCode::Char('j') => self.selected += 1,
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::PageDown => self.selected += 10,
            KeyCode::PageUp => self.selected = self.selected.saturating_sub(10),
            KeyCode::Home => self.selected = 0,
            KeyCode::Enter => {
                let row = self.rows().into_iter().nth(self.selected);
                let function = row.and_then(|row| row.function);
                self.opened = if self.opened == function {
                    None
                } else {
                    function
                };
            }
            KeyCode::Esc => {
                if self.opened.is_some() {
                    self.opened = None;
                } else {
                    self.filter.clear();
                }
            }
            _ => {}
        }
        self.selected = self.selected.min(rows.saturating_sub(1));
        Action::Redraw
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::summary::EventWindow;

    fn function(name: &str) -> FunctionName {
        FunctionName {
            name: name.into(),
            module: "app".into(),
        }
    }

    /// A window of `cpu-clock` with `hot` and `cold` self samples under main, and an off-CPU
    /// event with 1 ms blocked in `wait`.
    fn window(hot: u64, cold: u64) -> WindowSummary {
        let counts = |self_count, total_count| FunctionCounts {
            self_count,
            total_count,
        };
        let cpu = EventWindow {
            name: "cpu-clock".into(),
            unit: "samples".into(),
            kept: hot + cold,
            fired: hot + cold + 1,
            functions: [
                (function("hot"), counts(hot, hot)),
                (function("cold"), counts(cold, cold)),
                (function("main"), counts(0, hot + cold)),
            ]
            .into_iter()
            .collect(),
            processes: [("app 7".to_string(), hot + cold)].into_iter().collect(),
            containers: [("(host)".to_string(), hot + cold)].into_iter().collect(),
            calls: [
                ((function("main"), function("hot")), hot),
                ((function("main"), function("cold")), cold),
            ]
            .into_iter()
            .collect(),
        };
        let off_cpu = EventWindow {
            name: "off-cpu".into(),
            unit: "nanoseconds".into(),
            kept: 1_000_000,
            fired: 1,
            functions: [(function("wait"), counts(1_000_000, 1_000_000))]
                .into_iter()
                .collect(),
            ..EventWindow::default()
        };
        WindowSummary {
            seconds: 1.0,
            events: vec![cpu, off_cpu],
            losses: [("samples lost: stack-count map full".to_string(), 1)]
                .into_iter()
                .collect(),
        }
    }

    fn key(state: &mut TopState, code: KeyCode) -> Action {
        state.key(KeyEvent::new(code, KeyModifiers::NONE))
    }

    fn names(state: &TopState) -> Vec<String> {
        state.rows().into_iter().map(|row| row.name).collect()
    }

    #[test]
    fn rows_add_up_the_last_windows_and_trend_over_all() {
        let mut state = TopState::default();
        // An old window (out of the span) where cold was hot.
        state.push(window(10, 90));
        for _ in 0..SPAN {
            state.push(window(60, 40));
        }
        let rows = state.rows();
        assert_eq!(names(&state), ["hot", "cold", "main"]);
        assert_eq!(rows[0].self_share, 60.0);
        assert_eq!(rows[0].total_share, Some(60.0));
        assert_eq!(rows[2].total_share, Some(100.0));
        assert_eq!(rows[0].trend.first(), Some(&10.0));
        assert_eq!(rows[0].trend.len(), SPAN + 1);
        let accounting = state.accounting();
        assert_eq!(
            (accounting.kept, accounting.fired, accounting.lost),
            (500, 505, 5)
        );
        assert_eq!(accounting.seconds, SPAN as f64);
        for _ in 0..HISTORY {
            state.push(window(1, 1));
        }
        assert_eq!(state.rows()[0].trend.len(), HISTORY);
    }

    #[test]
    fn keys_sort_filter_switch_and_open_callers() {
        let mut state = TopState::default();
        state.push(window(60, 40));
        key(&mut state, KeyCode::Char('s'));
        assert_eq!(state.order, Order::TotalShare);
        assert_eq!(names(&state), ["main", "hot", "cold"]);
        key(&mut state, KeyCode::Char('s'));
        assert_eq!(names(&state), ["cold", "hot", "main"]);
        key(&mut state, KeyCode::Char('s'));
        // Typing filters by name, case aside; `q` typed is a letter, not quit.
        key(&mut state, KeyCode::Char('/'));
        for c in "CoQ".chars() {
            assert_eq!(key(&mut state, KeyCode::Char(c)), Action::Redraw);
        }
        assert!(names(&state).is_empty());
        key(&mut state, KeyCode::Backspace);
        key(&mut state, KeyCode::Enter);
        assert_eq!(names(&state), ["cold"]);
        key(&mut state, KeyCode::Esc);
        assert_eq!(names(&state).len(), 3);
        // Down to main, opened: its callees.
        key(&mut state, KeyCode::Down);
        key(&mut state, KeyCode::Down);
        key(&mut state, KeyCode::Down);
        assert_eq!(state.selected, 2, "stops at the last row");
        key(&mut state, KeyCode::Enter);
        let (name, callers, callees) = state.neighbours().unwrap();
        assert_eq!(name, "main");
        assert!(callers.is_empty());
        assert_eq!(
            callees,
            [
                Neighbour {
                    name: "hot".into(),
                    share: 60.0
                },
                Neighbour {
                    name: "cold".into(),
                    share: 40.0
                }
            ]
        );
        key(&mut state, KeyCode::Enter);
        assert!(state.neighbours().is_none());
        key(&mut state, KeyCode::Home);
        key(&mut state, KeyCode::Enter);
        let (name, callers, callees) = state.neighbours().unwrap();
        assert_eq!(name, "hot");
        assert_eq!(callers[0].name, "main");
        assert_eq!(callees[0].name, SELF_ROW);
        assert_eq!(callees[0].share, 60.0);
        key(&mut state, KeyCode::Esc);
        assert!(state.neighbours().is_none());
        // Events: off-CPU time next, then back.
        key(&mut state, KeyCode::Char('e'));
        assert_eq!((state.event, state.unit()), (1, "nanoseconds"));
        assert_eq!(names(&state), ["wait"]);
        assert_eq!(state.rows()[0].self_share, 100.0);
        key(&mut state, KeyCode::Tab);
        assert_eq!(state.event, 0);
        key(&mut state, KeyCode::Char('v'));
        assert_eq!(names(&state), ["app 7"]);
        key(&mut state, KeyCode::Char('v'));
        assert_eq!(names(&state), ["(host)"]);
        key(&mut state, KeyCode::Char('v'));
        assert_eq!(state.table, Table::Functions);
        assert_eq!(key(&mut state, KeyCode::Char('q')), Action::Quit);
        let control_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        state.typing = true;
        assert_eq!(state.key(control_c), Action::Quit);
    }
}
