//! Money is integer microcents (1 cent = 1,000,000 µ¢); never a float.

use crate::config::ModelPrice;

pub const MICROS_PER_CENT: i64 = 1_000_000;

/// Scale at which configured prices (cents per million tokens = µ¢ per token) are kept
/// exactly: six decimal places of a microcent per token.
const PRICE_SCALE: i128 = 1_000_000;

pub fn cents_to_micros(cents: i64) -> i64 {
    cents.saturating_mul(MICROS_PER_CENT)
}

/// What a balance view shows: the floor of the microcents (−60 µ¢ shows as −1).
pub fn micros_to_cents_floor(micros: i64) -> i64 {
    micros.div_euclid(MICROS_PER_CENT)
}

/// A charge rounded up to whole cents (what a card or fee is charged).
pub fn micros_to_cents_ceil(micros: i64) -> i64 {
    -(-micros).div_euclid(MICROS_PER_CENT)
}

fn scaled_price(per_mtok_cents: f64) -> i128 {
    (per_mtok_cents * PRICE_SCALE as f64).round() as i128
}

fn div_ceil(n: i128, d: i128) -> i128 {
    -((-n).div_euclid(d))
}

/// The upstream cost and the marked-up charge of one serving request, in microcents,
/// each rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServingPrice {
    pub cost_microcents: i64,
    pub charged_microcents: i64,
}

pub fn price_serving(
    price: &ModelPrice,
    prompt_tokens: i64,
    completion_tokens: i64,
    markup_percent: i64,
) -> ServingPrice {
    let cost_scaled = i128::from(prompt_tokens) * scaled_price(price.input_per_mtok_cents)
        + i128::from(completion_tokens) * scaled_price(price.output_per_mtok_cents);
    let cost = div_ceil(cost_scaled, PRICE_SCALE);
    let charged = div_ceil(cost_scaled * i128::from(100 + markup_percent), PRICE_SCALE * 100);
    ServingPrice {
        cost_microcents: i64::try_from(cost).unwrap_or(i64::MAX),
        charged_microcents: i64::try_from(charged).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: ModelPrice = ModelPrice {
        input_per_mtok_cents: 10.0,
        output_per_mtok_cents: 20.0,
    };

    #[test]
    fn serving_is_priced_at_cost_plus_markup_rounded_up() {
        // 1000 × 10 + 500 × 20 = 20,000 µ¢; × 1.2 = 24,000 µ¢.
        let p = price_serving(&LLAMA, 1000, 500, 20);
        assert_eq!(p.cost_microcents, 20_000);
        assert_eq!(p.charged_microcents, 24_000);
        // 1 × 10 µ¢ × 1.2 = 12 µ¢ exactly; odd tokens at a fractional price round up.
        assert_eq!(price_serving(&LLAMA, 1, 0, 20).charged_microcents, 12);
        let cheap = ModelPrice {
            input_per_mtok_cents: 0.15,
            output_per_mtok_cents: 0.6,
        };
        // 7 × 0.15 = 1.05 µ¢ → cost 2; × 1.2 = 1.26 → 2.
        let p = price_serving(&cheap, 7, 0, 20);
        assert_eq!((p.cost_microcents, p.charged_microcents), (2, 2));
        assert_eq!(price_serving(&LLAMA, 0, 0, 20).charged_microcents, 0);
    }

    #[test]
    fn balances_show_the_floor_of_their_cents() {
        assert_eq!(micros_to_cents_floor(-60), -1);
        assert_eq!(micros_to_cents_floor(1_999_999), 1);
        assert_eq!(micros_to_cents_floor(0), 0);
        assert_eq!(micros_to_cents_ceil(1), 1);
        assert_eq!(micros_to_cents_ceil(-1_500_000), -1);
    }
}
