//! A card payment's state: the payment processor's (Stripe's PaymentIntent statuses), or
//! `declined`, keel's record of a charge the processor refused. The processor's list is
//! open-ended: a state keel does not know is kept as reported (stored and shown verbatim)
//! and counts as not settled.

use std::fmt;
use std::str::FromStr;

use sea_orm::DeriveValueType;

#[derive(Debug, Clone, PartialEq, Eq, Hash, DeriveValueType)]
#[sea_orm(value_type = "String")]
pub enum PaymentState {
    RequiresPaymentMethod,
    RequiresConfirmation,
    RequiresAction,
    Processing,
    RequiresCapture,
    Canceled,
    Succeeded,
    /// keel's own: the processor refused the charge.
    Declined,
    /// A state the processor added after keel was written, kept as reported.
    Other(String),
}

impl PaymentState {
    const KNOWN: [(&'static str, Self); 8] = [
        ("requires_payment_method", Self::RequiresPaymentMethod),
        ("requires_confirmation", Self::RequiresConfirmation),
        ("requires_action", Self::RequiresAction),
        ("processing", Self::Processing),
        ("requires_capture", Self::RequiresCapture),
        ("canceled", Self::Canceled),
        ("succeeded", Self::Succeeded),
        ("declined", Self::Declined),
    ];

    /// The state a processor's text names; never fails (see [`PaymentState::Other`]).
    pub fn parse(text: &str) -> Self {
        Self::KNOWN
            .iter()
            .find(|(name, _)| *name == text)
            .map_or_else(|| Self::Other(text.to_owned()), |(_, state)| state.clone())
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Other(text) => text,
            known => Self::KNOWN
                .iter()
                .find(|(_, state)| state == known)
                .map_or("", |(name, _)| name),
        }
    }

    /// Whether the money has arrived (the only state that credits the ledger).
    pub fn is_succeeded(&self) -> bool {
        *self == Self::Succeeded
    }
}

impl fmt::Display for PaymentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PaymentState {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self::parse(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_states_round_trip_and_unknown_ones_are_kept() {
        for (name, state) in PaymentState::KNOWN {
            assert_eq!(PaymentState::parse(name), state);
            assert_eq!(state.as_str(), name);
        }
        let later = PaymentState::parse("requires_reauthorization");
        assert_eq!(later, PaymentState::Other("requires_reauthorization".into()));
        assert_eq!(later.to_string(), "requires_reauthorization");
        assert!(!later.is_succeeded());
        assert!(PaymentState::parse("succeeded").is_succeeded());
    }
}
