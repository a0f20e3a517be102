pub mod ovsdb;
pub mod sandbox;
pub mod switch;
