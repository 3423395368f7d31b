//! Money (CONTRACT §4): integer cents where people type amounts and cards are charged,
//! integer microcents where the ledger keeps them, exact per-token prices. Every conversion
//! and rounding between them is here.

use std::fmt;
use std::ops::{Add, Neg};

use sea_orm::DeriveValueType;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

pub const MICROS_PER_CENT: i64 = 1_000_000;

/// Whole cents: amounts a person types (top-up, threshold, promo) and charges of a card.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, DeriveValueType,
)]
#[serde(transparent)]
pub struct Cents(pub i64);

impl Cents {
    /// The same amount in microcents (saturating: bounded inputs never reach the limit).
    pub const fn micros(self) -> Microcents {
        Microcents(self.0.saturating_mul(MICROS_PER_CENT))
    }

    pub const fn get(self) -> i64 {
        self.0
    }
}

/// The bare number, as messages and logs have always shown it.
impl fmt::Display for Cents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Microcents (1 ¢ = 1,000,000 µ¢): what balances and ledger entries hold.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, DeriveValueType,
)]
#[serde(transparent)]
pub struct Microcents(pub i64);

impl Microcents {
    pub const ZERO: Self = Self(0);

    pub const fn get(self) -> i64 {
        self.0
    }

    /// What a balance view shows: the floor (−60 µ¢ shows as −1 ¢).
    pub const fn floor_cents(self) -> Cents {
        Cents(self.0.div_euclid(MICROS_PER_CENT))
    }

    /// A charge in whole cents, rounded up.
    pub const fn ceil_cents(self) -> Cents {
        Cents(-(-self.0).div_euclid(MICROS_PER_CENT))
    }

    pub const fn saturating_add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }
}

impl Add for Microcents {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        self.saturating_add(other)
    }
}

impl Neg for Microcents {
    type Output = Self;

    fn neg(self) -> Self {
        Self(self.0.saturating_neg())
    }
}

/// The bare number, as messages and logs have always shown it.
impl fmt::Display for Microcents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Decimal places a configured price may have.
const PRICE_DECIMALS: u32 = 6;
/// A price is kept as an integer count of 10⁻⁶ µ¢ per token.
const PRICE_SCALE: i128 = 10_i128.pow(PRICE_DECIMALS);

/// An exact price per token: configured as cents per million tokens (= µ¢ per token) with
/// at most six decimal places, kept as an integer so a charge never depends on a float.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenPrice(i64);

impl TokenPrice {
    /// A price of whole microcents per token.
    pub const fn micros_per_token(micros: i64) -> Self {
        Self(micros * PRICE_SCALE as i64)
    }

    /// Parses decimal text ("10", "0.15"): non-negative, at most six decimal places.
    pub fn parse(text: &str) -> Result<Self, PriceError> {
        let text = text.trim();
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || !digits(fraction) {
            return Err(PriceError::NotADecimal(text.to_owned()));
        }
        if fraction.len() > PRICE_DECIMALS as usize {
            return Err(PriceError::TooPrecise(text.to_owned()));
        }
        let padded = format!("{whole}{fraction:0<width$}", width = PRICE_DECIMALS as usize);
        padded
            .parse::<i64>()
            .map(Self)
            .map_err(|_| PriceError::TooLarge(text.to_owned()))
    }

    /// The exact cost of `tokens` at this price, in 10⁻⁶ µ¢.
    fn scaled_cost(self, tokens: i64) -> i128 {
        i128::from(tokens) * i128::from(self.0)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PriceError {
    #[error("{0:?} is not a non-negative decimal number")]
    NotADecimal(String),
    #[error("{0:?} has more than six decimal places")]
    TooPrecise(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
}

impl<'de> Deserialize<'de> for TokenPrice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PriceVisitor;

        impl Visitor<'_> for PriceVisitor {
            type Value = TokenPrice;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative price with at most six decimal places")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<TokenPrice, E> {
                TokenPrice::parse(&v.to_string()).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<TokenPrice, E> {
                TokenPrice::parse(&v.to_string()).map_err(E::custom)
            }

            // A float's shortest round-trip spelling is the decimal that was written.
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<TokenPrice, E> {
                if !v.is_finite() {
                    return Err(E::custom(format!("{v} is not a price")));
                }
                TokenPrice::parse(&v.to_string()).map_err(E::custom)
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<TokenPrice, E> {
                TokenPrice::parse(v).map_err(E::custom)
            }
        }

        deserializer.deserialize_any(PriceVisitor)
    }
}

/// A model's configured prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct ModelPrice {
    pub input_per_mtok_cents: TokenPrice,
    pub output_per_mtok_cents: TokenPrice,
}

/// The upstream cost and the marked-up charge of one serving request, each rounded up to
/// a whole microcent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServingPrice {
    pub cost: Microcents,
    pub charged: Microcents,
}

fn div_ceil(n: i128, d: i128) -> i128 {
    -((-n).div_euclid(d))
}

fn saturate(v: i128) -> Microcents {
    Microcents(i64::try_from(v).unwrap_or(i64::MAX))
}

impl ModelPrice {
    /// Cost = prompt × input + completion × output; charge = ceil(cost × (100 + markup) / 100).
    pub fn serving(&self, prompt_tokens: i64, completion_tokens: i64, markup_percent: i64) -> ServingPrice {
        let cost = self.input_per_mtok_cents.scaled_cost(prompt_tokens)
            + self.output_per_mtok_cents.scaled_cost(completion_tokens);
        ServingPrice {
            cost: saturate(div_ceil(cost, PRICE_SCALE)),
            charged: saturate(div_ceil(
                cost * i128::from(100 + markup_percent),
                PRICE_SCALE * 100,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: ModelPrice = ModelPrice {
        input_per_mtok_cents: TokenPrice::micros_per_token(10),
        output_per_mtok_cents: TokenPrice::micros_per_token(20),
    };

    fn price(text: &str) -> TokenPrice {
        TokenPrice::parse(text).expect(text)
    }

    #[test]
    fn serving_is_priced_at_cost_plus_markup_rounded_up() {
        // 1000 × 10 + 500 × 20 = 20,000 µ¢; × 1.2 = 24,000 µ¢.
        let p = LLAMA.serving(1000, 500, 20);
        assert_eq!((p.cost, p.charged), (Microcents(20_000), Microcents(24_000)));
        // 1 × 10 µ¢ × 1.2 = 12 µ¢ exactly; odd tokens at a fractional price round up.
        assert_eq!(LLAMA.serving(1, 0, 20).charged, Microcents(12));
        let cheap = ModelPrice {
            input_per_mtok_cents: price("0.15"),
            output_per_mtok_cents: price("0.6"),
        };
        // 7 × 0.15 = 1.05 µ¢ → cost 2; × 1.2 = 1.26 → 2.
        let p = cheap.serving(7, 0, 20);
        assert_eq!((p.cost, p.charged), (Microcents(2), Microcents(2)));
        // 1,000,000 × 0.15 = 150,000 µ¢ exactly: no float residue rounds it up.
        assert_eq!(cheap.serving(1_000_000, 0, 0).cost, Microcents(150_000));
        assert_eq!(LLAMA.serving(0, 0, 20).charged, Microcents::ZERO);
    }

    #[test]
    fn balances_show_the_floor_of_their_cents_and_charges_the_ceiling() {
        assert_eq!(Microcents(-60).floor_cents(), Cents(-1));
        assert_eq!(Microcents(1_999_999).floor_cents(), Cents(1));
        assert_eq!(Microcents(0).floor_cents(), Cents(0));
        assert_eq!(Microcents(1).ceil_cents(), Cents(1));
        assert_eq!(Microcents(-1_500_000).ceil_cents(), Cents(-1));
        assert_eq!(Cents(250).micros(), Microcents(250_000_000));
        assert_eq!(Cents(i64::MAX).micros(), Microcents(i64::MAX));
    }

    #[test]
    fn prices_are_exact_decimals() {
        assert_eq!(price("10"), TokenPrice::micros_per_token(10));
        assert_eq!(price("0.15"), TokenPrice(150_000));
        assert_eq!(price("0.000001"), TokenPrice(1));
        assert!(matches!(
            TokenPrice::parse("0.0000001"),
            Err(PriceError::TooPrecise(_))
        ));
        for bad in ["-1", "", "1e3", "abc", ".5", "1.2.3"] {
            assert!(TokenPrice::parse(bad).is_err(), "{bad:?}");
        }
        // Config files give floats and integers; both land on the decimal written.
        let from: ModelPrice =
            serde_json::from_str(r#"{"input_per_mtok_cents": 0.15, "output_per_mtok_cents": 3}"#).unwrap();
        assert_eq!(from.input_per_mtok_cents, price("0.15"));
        assert_eq!(from.output_per_mtok_cents, TokenPrice::micros_per_token(3));
        assert!(serde_json::from_str::<ModelPrice>(
            r#"{"input_per_mtok_cents": -1.5, "output_per_mtok_cents": 3}"#
        )
        .is_err());
    }
}
