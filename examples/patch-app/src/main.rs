//! Prints which driver build the application was linked against, and shows that the fork's
//! connection-string options parse like upstream's. Needs no server.

use mongodb::options::ClientOptions;

#[tokio::main]
async fn main() -> mongodb::error::Result<()> {
    println!("linked against {}", mongodb::fork::IDENTITY);

    let options = ClientOptions::parse("mongodb://localhost:27017/?appName=patch-app&maxAdaptiveRetries=3").await?;
    println!(
        "appName={:?} maxAdaptiveRetries={:?}",
        options.app_name.as_deref().unwrap_or_default(),
        options.max_adaptive_retries
    );
    Ok(())
}
