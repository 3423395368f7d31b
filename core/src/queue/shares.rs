//! Fair shares across organizations (stride scheduling): every organization with queued
//! jobs of an action has a *pass*; a claim hands its next job to the organization with the
//! lowest pass that may take one (jobs queued, under its running cap), whose pass then grows
//! by 1 / weight. Passes are kept per action between claims, so shares hold over successive
//! claims of any size, one job at a time included, and on every instance (claims of all
//! instances take turns under one database lock). An organization that was idle does not
//! bank credit: its pass is raised to at least one full stride (1) below the highest pass of
//! the organizations waiting with it.

use crate::domain::OrgId;

/// An organization with queued jobs, as a claim weighs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Contender {
    pub org_id: OrgId,
    /// 1..100.
    pub weight: i32,
    /// Jobs it may take now: queued ones (as many as the claim could take), bounded by
    /// its running cap.
    pub available: i64,
    /// Its pass as the last claim left it (none: never handed a job of this action).
    pub pass: Option<f64>,
}

/// One organization's part of a claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Allotment {
    pub org_id: OrgId,
    /// Jobs to hand it.
    pub jobs: i64,
    /// Its pass before this claim (after raising an idle one).
    pub pass: f64,
    pub weight: i32,
    /// It had no pass yet: the one given here is kept even if it is handed nothing (else
    /// its place would be worked out again, and differently, at every claim).
    pub first: bool,
}

impl Allotment {
    /// Its pass after it was handed `handed` jobs.
    pub fn pass_after(&self, handed: i64) -> f64 {
        self.pass + handed as f64 / f64::from(self.weight.max(1))
    }
}

/// Splits `limit` jobs among the contenders: one at a time to the lowest pass (then the
/// lowest organization id), each pick advancing that pass by 1 / weight. Answers every
/// contender that may take jobs, with what it is handed (0 included).
pub fn allot(contenders: &[Contender], limit: u32) -> Vec<Allotment> {
    allot_in_order(contenders, limit).0
}

/// [`allot`], and its picks in the order they were made (an index into the allotments per
/// job): a claim statement serving several claimants hands each its run of picks.
pub fn allot_in_order(contenders: &[Contender], limit: u32) -> (Vec<Allotment>, Vec<usize>) {
    let highest = contenders
        .iter()
        .filter_map(|c| c.pass)
        .fold(None, |high: Option<f64>, pass| {
            Some(high.map_or(pass, |h| h.max(pass)))
        })
        .unwrap_or(0.0);
    let floor = highest - 1.0;
    let mut state: Vec<(Allotment, f64, i64)> = contenders
        .iter()
        .filter(|c| c.available > 0)
        .map(|c| {
            let pass = c.pass.map_or(floor, |p| p.max(floor));
            let allotment = Allotment {
                org_id: c.org_id.clone(),
                jobs: 0,
                pass,
                weight: c.weight.max(1),
                first: c.pass.is_none(),
            };
            (allotment, pass, c.available)
        })
        .collect();
    let mut picks = Vec::new();
    for _ in 0..limit {
        let next = state
            .iter_mut()
            .enumerate()
            .filter(|(_, (_, _, left))| *left > 0)
            .min_by(|(_, (a, pass_a, _)), (_, (b, pass_b, _))| {
                pass_a
                    .total_cmp(pass_b)
                    .then_with(|| a.org_id.as_str().cmp(b.org_id.as_str()))
            });
        let Some((index, (allotment, pass, left))) = next else {
            break;
        };
        allotment.jobs += 1;
        *pass += 1.0 / f64::from(allotment.weight);
        *left -= 1;
        picks.push(index);
    }
    let allotted = state.into_iter().map(|(allotment, _, _)| allotment).collect();
    (allotted, picks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn org(n: u8) -> OrgId {
        OrgId::parse(&format!("00000000-0000-4000-8000-0000000000{n:02}")).unwrap()
    }

    fn contender(n: u8, weight: i32, available: i64, pass: Option<f64>) -> Contender {
        Contender {
            org_id: org(n),
            weight,
            available,
            pass,
        }
    }

    /// Runs `claims` claims of `limit`, carrying passes between them as the database does.
    fn run(weights: &[i32], claims: usize, limit: u32) -> Vec<i64> {
        let mut passes: Vec<Option<f64>> = vec![None; weights.len()];
        let mut handed = vec![0; weights.len()];
        for _ in 0..claims {
            let contenders: Vec<Contender> = weights
                .iter()
                .enumerate()
                .map(|(i, w)| contender(i as u8, *w, 1000, passes[i]))
                .collect();
            for a in allot(&contenders, limit) {
                let i = weights
                    .iter()
                    .enumerate()
                    .position(|(i, _)| org(i as u8) == a.org_id)
                    .unwrap();
                handed[i] += a.jobs;
                if a.jobs > 0 || a.first {
                    passes[i] = Some(a.pass_after(a.jobs));
                }
            }
        }
        handed
    }

    #[test]
    fn shares_follow_weights_one_job_at_a_time_and_in_batches() {
        assert_eq!(run(&[3, 1], 20, 1), vec![15, 5]);
        assert_eq!(run(&[3, 1], 2, 10), vec![15, 5]);
        assert_eq!(run(&[1, 1], 10, 1), vec![5, 5]);
        assert_eq!(run(&[2, 1, 1], 40, 1), vec![20, 10, 10]);
        assert_eq!(run(&[100, 1], 101, 1), vec![100, 1]);
    }

    #[test]
    fn an_organization_takes_no_more_than_it_may_and_the_rest_go_to_others() {
        let contenders = [contender(1, 10, 2, None), contender(2, 1, 50, None)];
        let allotted = allot(&contenders, 10);
        assert_eq!(allotted.iter().map(|a| a.jobs).collect::<Vec<_>>(), vec![2, 8]);
        assert!(allotted.iter().all(|a| a.first));
        // Nothing available: nothing allotted.
        assert!(allot(&[contender(1, 1, 0, None)], 5).is_empty());
    }

    #[test]
    fn picks_come_in_the_order_made() {
        let contenders = [contender(1, 2, 10, Some(0.0)), contender(2, 1, 10, Some(0.0))];
        let (allotted, picks) = allot_in_order(&contenders, 6);
        assert_eq!(allotted.iter().map(|a| a.jobs).collect::<Vec<_>>(), vec![4, 2]);
        // Passes 0, 0 -> org 1 (0.5), org 2 (1) -> org 1 (1.0) ... ties to the lower id.
        assert_eq!(picks, vec![0, 1, 0, 0, 1, 0]);
    }

    #[test]
    fn an_idle_organization_banks_no_credit() {
        // Org 1 was handed a thousand jobs while org 2 was away; org 2 comes back far behind.
        let contenders = [
            contender(1, 1, 100, Some(1000.0)),
            contender(2, 1, 100, Some(3.0)),
        ];
        let allotted = allot(&contenders, 10);
        let jobs: Vec<i64> = allotted.iter().map(|a| a.jobs).collect();
        // One stride of catch-up at most (org 2's first pick), then turns: 5 and 5, not 0
        // and 10.
        assert_eq!(jobs, vec![5, 5]);
    }

    proptest::proptest! {
        /// With every organization backlogged, each one's jobs stay within a few of its
        /// weight's proportion, whatever the weights and the claims' sizes.
        #[test]
        fn shares_stay_proportional(
            weights in proptest::collection::vec(1i32..=100, 2..6),
            limits in proptest::collection::vec(1u32..=20, 1..40),
        ) {
            let mut passes: Vec<Option<f64>> = vec![None; weights.len()];
            let mut handed = vec![0i64; weights.len()];
            for limit in &limits {
                let contenders: Vec<Contender> = weights
                    .iter()
                    .enumerate()
                    .map(|(i, w)| contender(i as u8, *w, 10_000, passes[i]))
                    .collect();
                let allotted = allot(&contenders, *limit);
                proptest::prop_assert_eq!(allotted.iter().map(|a| a.jobs).sum::<i64>(), i64::from(*limit));
                for (i, a) in allotted.iter().enumerate() {
                    handed[i] += a.jobs;
                    if a.jobs > 0 || a.first {
                        passes[i] = Some(a.pass_after(a.jobs));
                    }
                }
            }
            let total: i64 = handed.iter().sum();
            let weight_sum: i32 = weights.iter().sum();
            for (i, w) in weights.iter().enumerate() {
                let expected = total as f64 * f64::from(*w) / f64::from(weight_sum);
                proptest::prop_assert!(
                    (handed[i] as f64 - expected).abs() <= weights.len() as f64 + 1.0,
                    "org {} of weight {} got {} of {}, expected {:.1}", i, w, handed[i], total, expected
                );
            }
        }
    }
}
