//! Prints which driver build the application was linked against, and shows that the fork's
//! connection-string options parse like upstream's. Needs no server.

use mongodb::options::ClientOptions;

#[tokio::main]
async fn main() -> mongodb::error::Result<()> {
    println!("linked against {}", mongodb::fork::IDENTITY);
    // The handshake sends this after upstream's version in `driver.version`, so server logs name
    // the fork release too.
    println!("handshake fork version {}", mongodb::fork::FORK_VERSION);

    let options = ClientOptions::parse(
        "mongodb://localhost:27017/?appName=patch-app&maxAdaptiveRetries=3",
    )
    .await?;
    println!(
        "appName={:?} maxAdaptiveRetries={:?}",
        options.app_name.as_deref().unwrap_or_default(),
        options.max_adaptive_retries
    );
    Ok(())
}
