//! Monitors (RFC 7047 §4.1.5, and `monitor_cond` of OVS): what to monitor, the parsing of the
//! `<table-updates>` / `<table-updates2>` the server sends, and the stream of them a monitor
//! delivers. The connection side (registering, routing notifications) is [`crate::client`].

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::lock;
use crate::datum::brief;
use crate::txn::Condition;
use crate::types::{as_row, Row};
use crate::OvsdbError;

/// v1 (`monitor`) row change: `old` holds the previous values of changed
/// columns (modify) or the whole row (delete); `new` holds all monitored
/// columns (initial/insert/modify).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowUpdate {
    pub old: Option<Row>,
    pub new: Option<Row>,
}

/// v2 (`monitor_cond`) row change. `Modify` carries a *diff*: for set and map
/// columns the listed elements are toggled, not the new value.
#[derive(Debug, Clone, PartialEq)]
pub enum RowUpdate2 {
    Initial(Row),
    Insert(Row),
    Modify(Row),
    Delete(Option<Row>),
}

/// table -> row uuid -> change
pub type TableUpdates = BTreeMap<String, BTreeMap<String, RowUpdate>>;
/// table -> row uuid -> change
pub type TableUpdates2 = BTreeMap<String, BTreeMap<String, RowUpdate2>>;

/// Parsing of a `<table-updates>` / `<table-updates2>` object.
pub trait ParseUpdates: Sized + Send + 'static {
    fn parse_updates(v: &Value) -> Result<Self, OvsdbError>;
}

fn parse_table_map<R>(
    v: &Value,
    what: &str,
    mut f: impl FnMut(&str, &str, &Value) -> Result<R, OvsdbError>,
) -> Result<BTreeMap<String, BTreeMap<String, R>>, OvsdbError> {
    let tables = v
        .as_object()
        .ok_or_else(|| OvsdbError::Protocol(format!("{what} is not an object: {}", brief(v))))?;
    let mut out = BTreeMap::new();
    for (table, rows) in tables {
        let rows = rows.as_object().ok_or_else(|| {
            OvsdbError::Protocol(format!("{what}: table {table:?} is not an object"))
        })?;
        let mut t = BTreeMap::new();
        for (uuid, upd) in rows {
            t.insert(uuid.clone(), f(table, uuid, upd)?);
        }
        out.insert(table.clone(), t);
    }
    Ok(out)
}

impl ParseUpdates for TableUpdates {
    fn parse_updates(v: &Value) -> Result<Self, OvsdbError> {
        parse_table_map(v, "table-updates", |table, uuid, upd| {
            let what = format!("table-updates {table}/{uuid}");
            let obj = as_row(upd, &what)?;
            let get = |k: &str| -> Result<Option<Row>, OvsdbError> {
                match obj.get(k) {
                    None | Some(Value::Null) => Ok(None),
                    Some(r) => Ok(Some(as_row(r, &format!("{what} {k:?}"))?.clone())),
                }
            };
            Ok(RowUpdate {
                old: get("old")?,
                new: get("new")?,
            })
        })
    }
}

impl ParseUpdates for TableUpdates2 {
    fn parse_updates(v: &Value) -> Result<Self, OvsdbError> {
        parse_table_map(v, "table-updates2", |table, uuid, upd| {
            let what = format!("table-updates2 {table}/{uuid}");
            let obj = as_row(upd, &what)?;
            let (kind, row) = match obj.iter().next() {
                Some(kv) if obj.len() == 1 => kv,
                _ => {
                    return Err(OvsdbError::Protocol(format!(
                        "{what}: expected exactly one of initial/insert/modify/delete, found {}",
                        brief(upd)
                    )))
                }
            };
            let row_of = |r: &Value| as_row(r, &format!("{what} {kind:?}")).cloned();
            match kind.as_str() {
                "initial" => Ok(RowUpdate2::Initial(row_of(row)?)),
                "insert" => Ok(RowUpdate2::Insert(row_of(row)?)),
                "modify" => Ok(RowUpdate2::Modify(row_of(row)?)),
                "delete" => match row {
                    Value::Null => Ok(RowUpdate2::Delete(None)),
                    r => Ok(RowUpdate2::Delete(Some(row_of(r)?))),
                },
                other => Err(OvsdbError::Protocol(format!(
                    "{what}: unknown update kind {other:?}"
                ))),
            }
        })
    }
}

/// Which changes a monitor reports (all by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MonitorSelect {
    pub initial: bool,
    pub insert: bool,
    pub delete: bool,
    pub modify: bool,
}

impl Default for MonitorSelect {
    fn default() -> Self {
        MonitorSelect {
            initial: true,
            insert: true,
            delete: true,
            modify: true,
        }
    }
}

/// What to monitor in one table.
#[derive(Debug, Clone, Default)]
pub struct MonitorRequest {
    /// Columns to report; `None` means all columns.
    pub columns: Option<Vec<String>>,
    /// Conditions, only honoured by `monitor_cond`; plain `monitor` has no conditions and
    /// ignores them.
    pub conditions: Option<Vec<Condition>>,
    pub select: Option<MonitorSelect>,
}

impl MonitorRequest {
    pub fn columns<I: IntoIterator<Item = S>, S: Into<String>>(cols: I) -> Self {
        MonitorRequest {
            columns: Some(cols.into_iter().map(Into::into).collect()),
            ..Default::default()
        }
    }

    pub fn with_conditions(mut self, conditions: Vec<Condition>) -> Self {
        self.conditions = Some(conditions);
        self
    }
}

/// Why a monitor stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MonitorEnd {
    /// `monitor_cancel` was called.
    Cancelled,
    /// The connection closed.
    Disconnected,
    /// The consumer fell behind by more than `monitor_buffer` notifications.
    Overflow,
    /// The server sent an update we could not parse.
    Protocol(String),
}

/// An established monitor: its initial contents plus the stream of changes.
#[derive(Debug)]
pub struct Monitor<T> {
    /// The monitor id, for [`OvsdbClient::monitor_cancel`].
    pub id: String,
    pub initial: T,
    pub updates: MonitorStream<T>,
}

/// Stream of update notifications; ends when the monitor ends.
#[derive(Debug)]
pub struct MonitorStream<T> {
    pub(crate) rx: mpsc::Receiver<T>,
    pub(crate) end: Arc<Mutex<Option<MonitorEnd>>>,
}

impl<T> MonitorStream<T> {
    /// Next notification, or `None` once the monitor has ended.
    pub async fn recv(&mut self) -> Option<T> {
        self.rx.recv().await
    }

    /// Why the stream ended (`None` while it is still live).
    pub fn end_reason(&self) -> Option<MonitorEnd> {
        lock(&self.end).clone()
    }
}

impl<T> Stream for MonitorStream<T> {
    type Item = T;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.rx.poll_recv(cx)
    }
}

