//! What people add to traces: tags (`a-z0-9_.:-`, 1 to 50 characters) and named scores
//! (a number and an optional comment), at most 20 of each a trace. They filter the list and
//! the export, and the raw export carries them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::Utc;
use entities::{trace, trace_score, trace_tag};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    TransactionSession, TransactionTrait,
};

use super::TraceError;
use crate::domain::{OrgId, TraceId};

/// Tags and scores a trace holds at most.
pub const MAX_PER_TRACE: usize = 20;
/// A tag's or score name's characters at most.
pub const MAX_NAME_CHARS: usize = 50;
/// The pattern of a tag or a score's name.
pub const NAME_PATTERN: &str = "^[a-z0-9_.:-]{1,50}$";
/// The pattern of `minScore`: a score's name and the least value, `NAME:VALUE`.
pub const MIN_SCORE_PATTERN: &str = r"^[a-z0-9_.:-]{1,50}:-?[0-9]{1,15}(\.[0-9]{1,15})?$";

/// Whether `name` is a tag or score name: 1 to 50 of `a-z0-9_.:-`.
pub fn is_name(name: &str) -> bool {
    (1..=MAX_NAME_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b':' | b'-'))
}

/// `NAME:VALUE` as the score's name and the least value (`None` when it is not that).
pub fn parse_min_score(raw: &str) -> Option<(String, f64)> {
    let (name, value) = raw.rsplit_once(':')?;
    let value: f64 = value.parse().ok()?;
    (is_name(name) && value.is_finite()).then(|| (name.to_owned(), value))
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Score {
    pub value: f64,
    pub comment: Option<String>,
}

/// A trace's tags (sorted) and scores (by name).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Marks {
    pub tags: Vec<String>,
    pub scores: BTreeMap<String, Score>,
}

/// The marks of each of `ids` that has any.
pub async fn marks_of(db: &impl ConnectionTrait, ids: &[TraceId]) -> Result<HashMap<TraceId, Marks>, DbErr> {
    let mut marks: HashMap<TraceId, Marks> = HashMap::new();
    if ids.is_empty() {
        return Ok(marks);
    }
    for chunk in ids.chunks(500) {
        let tags = trace_tag::Entity::find()
            .filter(trace_tag::Column::TraceId.is_in(chunk.iter().cloned()))
            .order_by_asc(trace_tag::Column::Tag)
            .all(db)
            .await?;
        for tag in tags {
            marks.entry(tag.trace_id).or_default().tags.push(tag.tag);
        }
        let scores = trace_score::Entity::find()
            .filter(trace_score::Column::TraceId.is_in(chunk.iter().cloned()))
            .all(db)
            .await?;
        for score in scores {
            marks.entry(score.trace_id).or_default().scores.insert(
                score.name,
                Score {
                    value: score.value,
                    comment: score.comment,
                },
            );
        }
    }
    Ok(marks)
}

/// Those of `ids` that are traces of `orgs`.
async fn owned(db: &impl ConnectionTrait, ids: &[TraceId], orgs: &[OrgId]) -> Result<Vec<TraceId>, DbErr> {
    let mut found = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(500) {
        let rows: Vec<TraceId> = trace::Entity::find()
            .select_only()
            .column(trace::Column::Id)
            .filter(trace::Column::Id.is_in(chunk.iter().cloned()))
            .filter(trace::Column::OrgId.is_in(orgs.iter().map(OrgId::to_string)))
            .into_tuple()
            .all(db)
            .await?;
        found.extend(rows);
    }
    Ok(found)
}

/// What a change of tags did: the traces changed, and the asked ids that are not traces of
/// the caller's organizations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tagged {
    pub updated: usize,
    pub not_found: usize,
}

/// Adds and removes tags on the traces of `orgs` among `ids`, all or nothing: a trace that
/// would hold more than [`MAX_PER_TRACE`] tags refuses the whole change
/// ([`TraceError::TooManyMarks`]).
pub async fn change_tags(
    db: &impl TransactionTrait,
    orgs: &[OrgId],
    ids: &[TraceId],
    add: &[String],
    remove: &[String],
) -> Result<Tagged, TraceError> {
    let wanted: Vec<TraceId> = ids.iter().cloned().collect::<BTreeSet<_>>().into_iter().collect();
    let add: BTreeSet<&String> = add.iter().collect();
    let remove: BTreeSet<&String> = remove.iter().filter(|t| !add.contains(t)).collect();
    let txn = db.begin().await?;
    let found = owned(&txn, &wanted, orgs).await?;
    for chunk in found.chunks(500) {
        if !remove.is_empty() {
            trace_tag::Entity::delete_many()
                .filter(trace_tag::Column::TraceId.is_in(chunk.iter().cloned()))
                .filter(trace_tag::Column::Tag.is_in(remove.iter().map(|t| t.as_str())))
                .exec(&txn)
                .await?;
        }
        if !add.is_empty() {
            let rows = chunk.iter().flat_map(|id| {
                add.iter().map(move |tag| trace_tag::ActiveModel {
                    trace_id: Set(id.clone()),
                    tag: Set((*tag).clone()),
                })
            });
            trace_tag::Entity::insert_many(rows.collect::<Vec<_>>())
                .on_conflict(
                    OnConflict::columns([trace_tag::Column::TraceId, trace_tag::Column::Tag])
                        .do_nothing()
                        .to_owned(),
                )
                .exec_without_returning(&txn)
                .await?;
            let counts: Vec<(TraceId, i64)> = trace_tag::Entity::find()
                .select_only()
                .column(trace_tag::Column::TraceId)
                .column_as(trace_tag::Column::Tag.count(), "n")
                .filter(trace_tag::Column::TraceId.is_in(chunk.iter().cloned()))
                .group_by(trace_tag::Column::TraceId)
                .into_tuple()
                .all(&txn)
                .await?;
            if let Some((id, _)) = counts.iter().find(|(_, n)| *n > MAX_PER_TRACE as i64) {
                return Err(TraceError::TooManyMarks {
                    trace_id: id.clone(),
                    what: "tags",
                });
            }
        }
    }
    txn.commit().await?;
    Ok(Tagged {
        updated: found.len(),
        not_found: wanted.len() - found.len(),
    })
}

/// A score set again replaces its value and comment.
fn score_replaced() -> OnConflict {
    OnConflict::columns([trace_score::Column::TraceId, trace_score::Column::Name])
        .update_columns([
            trace_score::Column::Value,
            trace_score::Column::Comment,
            trace_score::Column::UpdatedAt,
        ])
        .to_owned()
}

/// Sets a score of a trace of `orgs`; answers the trace's scores.
pub async fn set_score(
    db: &impl TransactionTrait,
    orgs: &[OrgId],
    id: &TraceId,
    name: &str,
    value: f64,
    comment: Option<String>,
) -> Result<BTreeMap<String, Score>, TraceError> {
    let txn = db.begin().await?;
    if owned(&txn, std::slice::from_ref(id), orgs).await?.is_empty() {
        return Err(TraceError::TraceNotFound);
    }
    trace_score::Entity::insert(trace_score::ActiveModel {
        trace_id: Set(id.clone()),
        name: Set(name.to_owned()),
        value: Set(value),
        comment: Set(comment),
        updated_at: Set(Utc::now()),
    })
    .on_conflict(score_replaced())
    .exec_without_returning(&txn)
    .await?;
    let scores = marks_of(&txn, std::slice::from_ref(id))
        .await?
        .remove(id)
        .unwrap_or_default()
        .scores;
    if scores.len() > MAX_PER_TRACE {
        return Err(TraceError::TooManyMarks {
            trace_id: id.clone(),
            what: "scores",
        });
    }
    txn.commit().await?;
    Ok(scores)
}

/// Sets one score on each of `ids` of `orgs` in one transaction (the others are not found):
/// a bulk score from the console. Refused whole if a trace would pass its scores' bound.
pub async fn set_scores(
    db: &impl TransactionTrait,
    orgs: &[OrgId],
    ids: &[TraceId],
    name: &str,
    value: f64,
    comment: Option<String>,
) -> Result<Tagged, TraceError> {
    let wanted: Vec<TraceId> = ids.iter().cloned().collect::<BTreeSet<_>>().into_iter().collect();
    let txn = db.begin().await?;
    let found = owned(&txn, &wanted, orgs).await?;
    let now = Utc::now();
    for chunk in found.chunks(200) {
        trace_score::Entity::insert_many(chunk.iter().map(|id| trace_score::ActiveModel {
            trace_id: Set(id.clone()),
            name: Set(name.to_owned()),
            value: Set(value),
            comment: Set(comment.clone()),
            updated_at: Set(now),
        }))
        .on_conflict(score_replaced())
        .exec_without_returning(&txn)
        .await?;
    }
    for (id, marks) in marks_of(&txn, &found).await? {
        if marks.scores.len() > MAX_PER_TRACE {
            return Err(TraceError::TooManyMarks {
                trace_id: id,
                what: "scores",
            });
        }
    }
    txn.commit().await?;
    Ok(Tagged {
        updated: found.len(),
        not_found: wanted.len() - found.len(),
    })
}

/// Deletes a score of a trace of `orgs` (deleting one it does not have is no error); answers
/// the trace's scores.
pub async fn delete_score(
    db: &impl TransactionTrait,
    orgs: &[OrgId],
    id: &TraceId,
    name: &str,
) -> Result<BTreeMap<String, Score>, TraceError> {
    let txn = db.begin().await?;
    if owned(&txn, std::slice::from_ref(id), orgs).await?.is_empty() {
        return Err(TraceError::TraceNotFound);
    }
    trace_score::Entity::delete_many()
        .filter(trace_score::Column::TraceId.eq(id))
        .filter(trace_score::Column::Name.eq(name))
        .exec(&txn)
        .await?;
    let scores = marks_of(&txn, std::slice::from_ref(id))
        .await?
        .remove(id)
        .unwrap_or_default()
        .scores;
    txn.commit().await?;
    Ok(scores)
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_1_to_50_of_the_alphabet() {
        for good in ["good", "a", "v1.2:ok_-x", &"x".repeat(50)] {
            assert!(super::is_name(good), "{good}");
        }
        for bad in ["", "Good", "a b", "é", &"x".repeat(51), "tag/1"] {
            assert!(!super::is_name(bad), "{bad}");
        }
    }
}
